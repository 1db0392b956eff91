#include "tools/chunksize/model_tensors.h"

#include <array>
#include <utility>

namespace spillway::chunksize {
namespace {

struct Matrix {
  const char* name;
  std::uint64_t d2;  // elements in units of d_model^2
};
// 12 d^2 in all, the generator's parameter count.
constexpr std::array<Matrix, 4> kGptBlock{
    {{"qkv", 3}, {"attn_out", 1}, {"mlp_in", 4}, {"mlp_out", 4}}};

void add(std::vector<ModelTensor>& out, std::string name, std::size_t layer, DataKind kind,
         std::uint32_t slot, std::uint64_t bytes) {
  if (bytes > 0) out.push_back({std::move(name), layer, kind, slot, bytes});
}

void add_gpt_block(std::vector<ModelTensor>& out, const sim::ModelSpec& model, std::size_t l) {
  const std::uint64_t d = model.gpt->d_model;
  const std::uint64_t dtype = model.gpt->dtype_bytes;
  const std::string& layer = model.layers[l].name;
  struct Kind {
    const char* suffix;
    DataKind kind;
    std::uint32_t slot;
    std::uint64_t bytes_per_element;
  };
  const std::array<Kind, 5> kinds{{{"param", DataKind::param, 0, dtype},
                                   {"grad", DataKind::grad, 0, dtype},
                                   {"master", DataKind::master, 0, 4},
                                   {"exp_avg", DataKind::optimizer_state, 0, 4},
                                   {"exp_avg_sq", DataKind::optimizer_state, 1, 4}}};
  for (const Kind& kind : kinds) {
    for (const Matrix& matrix : kGptBlock) {
      add(out, layer + "." + matrix.name + "." + kind.suffix, l, kind.kind, kind.slot,
          matrix.d2 * d * d * kind.bytes_per_element);
    }
  }
}

// One parameter of `elements` as param and grad, each in its own group.
void add_parameter(std::vector<ModelTensor>& params, std::vector<ModelTensor>& grads,
                   const std::string& name, std::size_t layer, std::uint64_t elements,
                   std::uint64_t dtype_bytes) {
  add(params, name, layer, DataKind::param, 0, elements * dtype_bytes);
  add(grads, name + ".grad", layer, DataKind::grad, 0, elements * dtype_bytes);
}

}  // namespace

std::vector<ModelTensor> gpt_module_tensors(const GptModuleShape& shape) {
  const std::uint64_t d = shape.d_model;
  const std::uint64_t dtype = shape.dtype_bytes;
  std::vector<ModelTensor> params;
  std::vector<ModelTensor> grads;
  const auto parameter = [&](const std::string& name, std::size_t layer, std::uint64_t elements) {
    add_parameter(params, grads, name, layer, elements, dtype);
  };
  const auto linear = [&](const std::string& name, std::size_t layer, std::uint64_t in,
                          std::uint64_t out) {
    parameter(name + ".weight", layer, in * out);
    parameter(name + ".bias", layer, out);
  };
  const auto norm = [&](const std::string& name, std::size_t layer) {
    parameter(name + ".weight", layer, d);
    parameter(name + ".bias", layer, d);
  };
  parameter("token_embedding.weight", 0, shape.vocab * d);
  parameter("position_embedding.weight", 0, shape.positions * d);
  for (std::uint64_t l = 0; l < shape.layers; ++l) {
    const std::string block = "blocks." + std::to_string(l);
    const auto layer = static_cast<std::size_t>(l);
    norm(block + ".attention_norm", layer);
    linear(block + ".attention.qkv", layer, d, 3 * d);
    linear(block + ".attention.projection", layer, d, d);
    norm(block + ".mlp_norm", layer);
    linear(block + ".mlp_in", layer, d, 4 * d);
    linear(block + ".mlp_out", layer, 4 * d, d);
  }
  const auto last = static_cast<std::size_t>(shape.layers == 0 ? 0 : shape.layers - 1);
  norm("final_norm", last);
  if (!shape.tied_head) linear("head", last, d, shape.vocab);
  params.insert(params.end(), grads.begin(), grads.end());
  return params;
}

GptModuleShape demo_gpt_shape() { return {64, 16, 256, 4, 4, false}; }
GptModuleShape gpt2_small_shape() { return {50257, 1024, 768, 12, 4, true}; }
GptModuleShape gpt2_medium_shape() { return {50257, 1024, 1024, 24, 4, true}; }

std::vector<ModelTensor> model_tensors(const sim::ModelSpec& model) {
  std::vector<ModelTensor> tensors;
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    if (model.gpt) {
      add_gpt_block(tensors, model, l);
      continue;
    }
    const sim::LayerSpec& layer = model.layers[l];
    add(tensors, layer.name + ".param", l, DataKind::param, 0, layer.param_bytes);
    add(tensors, layer.name + ".grad", l, DataKind::grad, 0, layer.grad_bytes);
    add(tensors, layer.name + ".optimizer", l, DataKind::optimizer_state, 0, layer.optimizer_bytes);
  }
  return tensors;
}

}  // namespace spillway::chunksize
