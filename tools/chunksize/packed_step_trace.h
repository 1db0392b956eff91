// The step of a model description over a chunk-manager packing: the same ops
// as sim::step_trace (forward over the layers reading params, backward in
// reverse reading params and writing grads, then one optimizer op per layer
// writing params and optimizer state and reading grads), but each layer
// touches the chunks its tensors were packed into, so the simulated step
// pays for the waste of whole-tensor packing.
#pragma once

#include <vector>

#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/model_tensors.h"
#include "tools/sim/model_description.h"
#include "tracer/planner/step_trace.h"

namespace spillway::chunksize {

// `packing` is pack_tensors(tensors, ...) and `tensors` model_tensors(model).
plan::StepTrace packed_step_trace(const sim::ModelSpec& model,
                                  const std::vector<ModelTensor>& tensors, const Packing& packing);

}  // namespace spillway::chunksize
