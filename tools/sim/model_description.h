// Synthetic model descriptions for the simulator: a JSON list of layers, or
// a GPT-style generator, turned into the StepTrace of one training step
// (forward over the layers, backward in reverse, then one optimizer op per
// layer). docs/planner.md documents the JSON format.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tracer/planner/step_trace.h"

namespace spillway::sim {

struct LayerSpec {
  std::string name;
  std::uint64_t param_bytes = 0;
  std::uint64_t grad_bytes = 0;
  std::uint64_t optimizer_bytes = 0;   // fp32 master copy and moments
  std::uint64_t activation_bytes = 0;  // saved for backward, live from forward to backward
  std::uint64_t forward_ns = 0;
  std::uint64_t backward_ns = 0;
  std::uint64_t optimizer_ns = 0;
};

// A GPT block stack: 12 d^2 parameters per block, activations by Korthikanti
// et al. (sbh(34 + 5as/h) bytes at 16 bits), 2 flops per parameter per token
// plus attention forward, twice that backward, an Adam step bound by memory
// bandwidth. Embeddings and the head are left out.
struct GptSpec {
  std::uint64_t n_layers = 12;
  std::uint64_t d_model = 768;
  std::uint64_t seq = 1024;
  std::uint64_t batch = 8;
  std::uint64_t dtype_bytes = 2;
  double flops_per_s = 4e14;            // achieved, not peak
  double optimizer_bytes_per_s = 3e12;  // device memory bandwidth for the Adam step
};

struct ModelSpec {
  std::string name;
  std::vector<LayerSpec> layers;
  // Set by the GPT generator: the shape behind the layers, so tools that
  // need tensor sizes (spillway-chunksize) can split a block into matrices.
  std::optional<GptSpec> gpt;

  std::uint64_t model_bytes() const;
};

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

ModelSpec gpt_model(const GptSpec& spec);

// Parses the JSON text of a description (either "layers" or "gpt"); throws
// ModelError naming the field that is wrong.
ModelSpec parse_model(const std::string& json_text);
ModelSpec load_model(const std::string& path);

// Lays each kind of model data (params, grads, optimizer state) out in its
// own run of chunks, layer after layer, and emits the step's ops.
plan::StepTrace step_trace(const ModelSpec& model, std::uint64_t chunk_size);

// The chunks one layer's data occupies, by what the step's ops do with them.
struct LayerChunks {
  std::vector<plan::PlanChunk> params, grads, optimizer;  // optimizer: master and moments
};

// The training step over given chunks, one LayerChunks per layer: forward
// over the layers reading params, backward in reverse reading params and
// writing grads, then one optimizer op per layer writing params and
// optimizer state and reading grads. step_trace() is this over its layout.
plan::StepTrace layer_step_trace(const ModelSpec& model, const std::vector<LayerChunks>& chunks);

}  // namespace spillway::sim
