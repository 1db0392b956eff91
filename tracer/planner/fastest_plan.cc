// fastest_known_plan: the planner's option grid and offline Belady, each
// simulated, the shortest mean steady step kept.
#include "tracer/planner/fastest_plan.h"

#include <algorithm>
#include <string>

namespace spillway::plan {
namespace {

double steady_step_ns(const SimResult& result) {
  const std::size_t steady = result.steps.size() - kUnsettledPlannedSteps;
  return result.total(kUnsettledPlannedSteps, result.steps.size()).step_ns /
         static_cast<double>(steady);
}

}  // namespace

std::string FastestPlan::describe() const {
  if (result.policy == SimPolicy::belady) return "belady";
  return "planned, prefetch reserve " + std::to_string(options.prefetch_reserve) + ", headroom " +
         std::to_string(options.headroom_reserve);
}

FastestPlan fastest_known_plan(const StepTrace& trace, const CostModel& model, std::size_t steps) {
  steps = std::max(steps, kUnsettledPlannedSteps + 1);
  FastestPlan fastest;
  bool found = false;
  std::string error;
  const auto consider = [&](const SimResult& result, const PlanOptions& options) {
    if (!result.ok()) {
      if (error.empty()) error = result.error;
      return;
    }
    const double ns = steady_step_ns(result);
    if (found && ns >= fastest.steady_step_ns) return;  // ties keep the earlier, simpler one
    fastest = {result, options, ns};
    found = true;
  };
  for (std::size_t reserve = 0; reserve <= kFastestMaxReserve; ++reserve) {
    for (std::size_t headroom = 0; headroom <= kFastestMaxHeadroom; ++headroom) {
      const PlanOptions options{
          .prefetch_reserve = reserve, .headroom_reserve = headroom, .choose_headroom = false};
      consider(simulate(trace, model, SimPolicy::planned, steps, options), options);
    }
  }
  consider(simulate(trace, model, SimPolicy::belady, steps), PlanOptions{});
  if (!found) throw PlanError(error);
  return fastest;
}

}  // namespace spillway::plan
