#include "tools/chunksize/packed_step_trace.h"

#include <set>
#include <utility>

namespace spillway::chunksize {
namespace {

// A layer's chunks by what its ops do with them.
struct LayerChunks {
  std::set<plan::PlanChunk> params, grads, optimizer;  // optimizer: master and moments
};

void use(plan::TracedOp& op, const std::set<plan::PlanChunk>& chunks, bool write) {
  for (plan::PlanChunk chunk : chunks) op.chunks.push_back({chunk, write});
}

}  // namespace

plan::StepTrace packed_step_trace(const sim::ModelSpec& model,
                                  const std::vector<ModelTensor>& tensors, const Packing& packing) {
  std::vector<LayerChunks> layers(model.layers.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    LayerChunks& layer = layers[tensors[t].layer];
    const plan::PlanChunk chunk = packing.tensor_chunk[t];
    switch (tensors[t].kind) {
      case DataKind::param:
        layer.params.insert(chunk);
        break;
      case DataKind::grad:
        layer.grads.insert(chunk);
        break;
      case DataKind::master:
      case DataKind::optimizer_state:
        layer.optimizer.insert(chunk);
        break;
    }
  }

  plan::StepTrace trace;
  std::uint64_t live_activations = 0;
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    live_activations += model.layers[l].activation_bytes;
    plan::TracedOp op{
        "forward." + model.layers[l].name, model.layers[l].forward_ns, live_activations, {}};
    use(op, layers[l].params, false);
    trace.ops.push_back(std::move(op));
  }
  for (std::size_t l = model.layers.size(); l-- > 0;) {
    plan::TracedOp op{
        "backward." + model.layers[l].name, model.layers[l].backward_ns, live_activations, {}};
    use(op, layers[l].params, false);
    use(op, layers[l].grads, true);
    trace.ops.push_back(std::move(op));
    live_activations -= model.layers[l].activation_bytes;
  }
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    plan::TracedOp op{"optimizer." + model.layers[l].name, model.layers[l].optimizer_ns, 0, {}};
    use(op, layers[l].params, true);
    use(op, layers[l].grads, false);
    use(op, layers[l].optimizer, true);
    trace.ops.push_back(std::move(op));
  }
  return trace;
}

}  // namespace spillway::chunksize
