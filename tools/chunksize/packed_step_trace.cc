#include "tools/chunksize/packed_step_trace.h"

#include <set>

namespace spillway::chunksize {

plan::StepTrace packed_step_trace(const sim::ModelSpec& model,
                                  const std::vector<ModelTensor>& tensors, const Packing& packing) {
  // A layer's chunks by what its ops do with them, each once, in id order.
  struct ChunkSets {
    std::set<plan::PlanChunk> params, grads, optimizer;
  };
  std::vector<ChunkSets> sets(model.layers.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    ChunkSets& layer = sets[tensors[t].layer];
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
  std::vector<sim::LayerChunks> chunks;
  for (const ChunkSets& layer : sets)
    chunks.push_back({{layer.params.begin(), layer.params.end()},
                      {layer.grads.begin(), layer.grads.end()},
                      {layer.optimizer.begin(), layer.optimizer.end()}});
  return sim::layer_step_trace(model, chunks);
}

}  // namespace spillway::chunksize
