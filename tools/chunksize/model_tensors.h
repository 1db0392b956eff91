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

// A GPT as a torch module has it (tools/train_demo/gpt.h's layout): token
// and position embeddings, blocks of LayerNorm, qkv and projection Linears,
// LayerNorm, MLP in and out Linears (weights and biases), a final LayerNorm
// and the LM head (none when tied to the token embedding, as GPT-2's is).
// Every parameter and its gradient, in the module's parameter order, as the
// torch bridge registers a model trained by a torch optimizer.
struct GptModuleShape {
  std::uint64_t vocab = 64;
  std::uint64_t positions = 16;
  std::uint64_t d_model = 256;
  std::uint64_t layers = 4;
  std::uint64_t dtype_bytes = 4;
  bool tied_head = false;
};
std::vector<ModelTensor> gpt_module_tensors(const GptModuleShape& shape);

// The demo's GPT (spillway-train-demo's defaults), GPT-2 small (12 layers,
// d_model 768) and medium (24, 1024), vocab 50257, 1024 positions, fp32.
GptModuleShape demo_gpt_shape();
GptModuleShape gpt2_small_shape();
GptModuleShape gpt2_medium_shape();

}  // namespace spillway::chunksize
