// choose_headroom_reserve: simulate the planned policy with each candidate
// headroom and compare the totals of the steps after the first two.
#include "tracer/planner/headroom.h"

#include <cstdint>

#include "tracer/planner/cost_simulator.h"

namespace spillway::plan {
namespace {

// After the unsettled steps (kUnsettledPlannedSteps), steady steps: plans
// may settle into a short cycle of residencies (ties), so the steady steps
// span 12, a multiple of cycles of 2, 3, 4 and 6.
constexpr std::size_t kSteadySteps = 12;
// Steps within this fraction of each other tie: more headroom costs bytes
// on the way from another residency (the first planned step) for nothing.
constexpr double kTie = 1e-3;

struct Steady {
  std::uint64_t bytes = 0;
  double ns = 0;
};

// Totals over the steady steps (the same count for every candidate).
Steady steady_cost(const SimResult& result) {
  const StepCost steady = result.total(kUnsettledPlannedSteps, result.steps.size());
  return {steady.h2d_bytes + steady.d2h_bytes, steady.step_ns};
}

}  // namespace

std::size_t choose_headroom_reserve(const StepTrace& trace, const CostModel& model,
                                    PlanOptions options, std::size_t max_headroom) {
  options.choose_headroom = false;
  options.headroom_reserve = 0;
  constexpr std::size_t kSteps = kUnsettledPlannedSteps + kSteadySteps;
  const SimResult none = simulate(trace, model, SimPolicy::planned, kSteps, options);
  if (!none.ok()) throw PlanError(none.error);
  const Steady pure = steady_cost(none);
  std::size_t best = 0;
  double best_ns = pure.ns;
  for (std::size_t headroom = 1; headroom <= max_headroom; ++headroom) {
    options.headroom_reserve = headroom;
    const SimResult trial = simulate(trace, model, SimPolicy::planned, kSteps, options);
    if (!trial.ok()) continue;
    const Steady cost = steady_cost(trial);
    if (cost.bytes <= pure.bytes && cost.ns < best_ns * (1 - kTie)) {
      best = headroom;
      best_ns = cost.ns;
    }
  }
  return best;
}

}  // namespace spillway::plan
