// Cost simulator: replays a traced step N times on a cost model (op
// durations, copy bandwidth, budget) under one policy and reports bytes
// moved, stall time and step time (design section 5).
//
// The model: ops run back to back on one compute stream; copies run on one
// FIFO stream per direction, overlapping compute. A copy is issued when the
// compute stream reaches the op it is planned for (the end of the previous
// op); a fetch waits for the room it fills to be vacated (a dirty victim's
// device-to-host copy), and an op waits for its chunks to arrive (stall
// time) and for the room its own bytes take, where a victim's write-back
// still holds it (spill waits; Note [An op waits for the room it takes]).
//
// Policies:
//   planned  step 1 runs under LRU (the traced warmup step), later steps
//            follow the planner's plan for the residency they start from,
//            with the headroom choose_headroom_reserve picks for the trace;
//   lru      demand fetch, evict the least recently used chunk, no prefetch;
//   static   nothing moves: every chunk lives on the device, or it fails;
//   belady   offline Belady over the whole run (all steps as one sequence),
//            with prefetch: the reference planned is measured against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tracer/planner/planner.h"
#include "tracer/planner/step_trace.h"

namespace spillway::plan {

enum class SimPolicy { planned, lru, static_residency, belady };

std::string_view policy_name(SimPolicy policy);

struct StepCost {
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  double stall_ns = 0;       // ops waiting for their chunks to arrive
  double spill_wait_ns = 0;  // ops waiting for room still being written back
  double step_ns = 0;        // from the first op's start (with its waits) to the last op's end
};

// The planned policy's first step runs under LRU (the traced warmup step)
// and its second starts from LRU's residency: steps from this index on are
// its steady ones.
inline constexpr std::size_t kUnsettledPlannedSteps = 2;

struct SimResult {
  SimPolicy policy = SimPolicy::lru;
  std::vector<StepCost> steps;
  std::string error;  // the policy cannot run this step (static over budget, an op too big)

  bool ok() const { return error.empty(); }
  StepCost total() const;
  // The sum of steps [first, end), end clamped to the steps run.
  StepCost total(std::size_t first, std::size_t end) const;
  const StepCost& last() const { return steps.back(); }
};

// The lower bound of one repeating step: compute, the bytes the steady
// Belady plan must move in each direction at the copy bandwidth, and the
// copies room forces into stretches of the step (Note [A bound that knows
// room] in cost_simulator.cc).
struct StepBound {
  double compute_ns = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
  double flat_ns = 0;   // max(compute, h2d bytes / bw, d2h bytes / bw)
  double room_ns = 0;   // the best cut of the step into stretches
  double bound_ns = 0;  // max(flat_ns, room_ns)
};

// `plan_options` are the planned policy's, its headroom_reserve replaced by
// choose_headroom_reserve's pick unless choose_headroom is off (the belady
// reference is always pure offline Belady).
SimResult simulate(const StepTrace& trace, const CostModel& model, SimPolicy policy,
                   std::size_t steps, PlanOptions plan_options = {});

// Throws PlanError when an op does not fit.
StepBound step_bound(const StepTrace& trace, const CostModel& model);

}  // namespace spillway::plan
