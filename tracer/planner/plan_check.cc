// check_plan: an independent replay, so it shares no bookkeeping with the
// planner's two passes. A fetch holds its room from issue, not arrival.
#include "tracer/planner/plan_check.h"

#include <set>

namespace spillway::plan {

std::optional<std::string> check_plan(const StepTrace& trace, const CostModel& model,
                                      const Plan& plan) {
  if (plan.ops.size() != trace.ops.size()) return "plan has a different number of ops";
  const std::vector<std::size_t> capacity = chunk_capacity(trace, model);
  std::set<PlanChunk> resident;
  for (const auto& [chunk, dirty] : plan.start) resident.insert(chunk);
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const std::string where = "op #" + std::to_string(i) + ": ";
    std::set<PlanChunk> needed;
    for (const ChunkUse& use : trace.ops[i].chunks) needed.insert(use.chunk);
    for (PlanChunk chunk : plan.ops[i].write_back) {
      if (!resident.contains(chunk)) {
        return where + "writes back chunk " + std::to_string(chunk) + ", not resident";
      }
    }
    for (const PlannedEviction& eviction : plan.ops[i].evict) {
      if (!resident.erase(eviction.chunk)) {
        return where + "evicts chunk " + std::to_string(eviction.chunk) + ", not resident";
      }
      if (needed.contains(eviction.chunk)) {
        return where + "evicts chunk " + std::to_string(eviction.chunk) + ", which it needs";
      }
    }
    for (const PlannedFetch& fetch : plan.ops[i].fetch) {
      if (fetch.use_op < i) return where + "fetch for an earlier op";
      if (fetch.use_op >= trace.ops.size()) return where + "fetch for an op past the step";
      // A zero fill in place of a copy loses the chunk's bytes.
      if (fetch.zero_fill && !fresh_use(trace.ops[fetch.use_op], fetch.chunk)) {
        return where + "zeroes chunk " + std::to_string(fetch.chunk) + ", whose use is not fresh";
      }
      if (!resident.insert(fetch.chunk).second) {
        return where + "fetches chunk " + std::to_string(fetch.chunk) + ", already resident";
      }
    }
    for (PlanChunk chunk : needed) {
      if (!resident.contains(chunk)) {
        return where + "needs chunk " + std::to_string(chunk) + ", not resident";
      }
    }
    if (resident.size() > capacity[i]) {
      return where + std::to_string(resident.size()) + " chunks resident or in flight, budget " +
             std::to_string(capacity[i]);
    }
  }
  return std::nullopt;
}

}  // namespace spillway::plan
