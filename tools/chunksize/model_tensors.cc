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

}  // namespace

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
