// The tensors of a model description, as a bridge would register them with
// the chunk manager: each layer's data split by kind (params, grads, fp32
// master, optimizer state slots), each kind packed into its own run of chunks.
//
// A GPT description (the generator, --gpt or a "gpt" object) knows its
// shape, so a block is its four matrices (qkv 3d^2, attention out d^2, MLP
// in 4d^2, MLP out 4d^2; biases and norms left out as the generator leaves
// them out) in params and grads (dtype_bytes each), fp32 master, Adam's
// exp_avg and exp_avg_sq (4 bytes each). A description by layers knows only
// bytes, so each layer's params, grads and optimizer bytes are one tensor
// each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/sim/model_description.h"

namespace spillway::chunksize {

// The chunk manager's TensorKind; optimizer_state has a slot per moment.
enum class DataKind : std::uint8_t { param, grad, master, optimizer_state };

struct ModelTensor {
  std::string name;   // e.g. "block3.mlp_in.master", for messages
  std::size_t layer;  // index into ModelSpec::layers
  DataKind kind = DataKind::param;
  std::uint32_t slot = 0;
  std::uint64_t bytes = 0;
};

// In registration order: layer after layer, kinds in the order above.
std::vector<ModelTensor> model_tensors(const sim::ModelSpec& model);

}  // namespace spillway::chunksize
