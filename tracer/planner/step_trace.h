// StepTrace: what the planner and the simulator know of one training step.
//
// A step is the ordered list of its moments (ops that touch managed chunks),
// each with its measured duration, the chunks it needs resident and whether
// it writes them, and the peak non-model (activation, temporary) bytes live
// while it runs. Plain ids and sizes only, so this stays below the allocator
// (design section 1): a planner chunk id is the chunk manager's ChunkId.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spillway::plan {

using PlanChunk = std::uint32_t;

struct ChunkUse {
  PlanChunk chunk = 0;
  // A written chunk is dirty until it leaves the device, and leaving then
  // costs a device-to-host copy; a chunk only read since it arrived is dropped.
  bool write = false;
  // The chunk has no bytes before this use: what it held since its use
  // before is dead (every tensor in it discarded, as the gradients set to
  // none after a step are). It leaves after that earlier use without a
  // write-back, and comes in for this one zeroed on the device, with no copy
  // (Note [A chunk without bytes is zeroed on the device] in
  // allocator/chunk/chunk_manager.cc).
  bool fresh = false;
};

struct TracedOp {
  std::string name;
  std::uint64_t duration_ns = 0;
  std::uint64_t non_model_bytes = 0;  // peak non-model bytes live during the op
  std::vector<ChunkUse> chunks;
};

struct StepTrace {
  std::vector<TracedOp> ops;
};

// The device the plan is for. Every chunk has chunk_size bytes.
struct CostModel {
  std::uint64_t device_budget = 0;
  std::uint64_t chunk_size = 0;
  std::uint64_t margin_bytes = 0;  // kept free besides the non-model peak
  double h2d_bytes_per_s = 0;      // 0: copies are instant
  double d2h_bytes_per_s = 0;

  double h2d_ns(std::uint64_t bytes) const {
    return h2d_bytes_per_s > 0 ? static_cast<double>(bytes) * 1e9 / h2d_bytes_per_s : 0.0;
  }
  double d2h_ns(std::uint64_t bytes) const {
    return d2h_bytes_per_s > 0 ? static_cast<double>(bytes) * 1e9 / d2h_bytes_per_s : 0.0;
  }
};

}  // namespace spillway::plan
