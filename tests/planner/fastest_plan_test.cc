// fastest_known_plan: on random steps no candidate it tries beats the bound
// (every step of every candidate, which widens the bound's property test to
// the whole option grid), it is never slower than the planned policy's own
// pick or offline Belady, it finds faster plans than the planned policy's
// pick on some, and the options it reports are the ones that ran.
#include <gtest/gtest.h>

#include <random>

#include "tests/planner/bound_property.h"
#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/fastest_plan.h"

namespace spillway::plan {
namespace {

constexpr std::uint64_t kChunk = 1 << 20;
constexpr std::size_t kSteps = 6;

double mean_after_settling(const SimResult& result) {
  double sum = 0;
  for (std::size_t s = kUnsettledPlannedSteps; s < result.steps.size(); ++s) {
    sum += result.steps[s].step_ns;
  }
  return sum / static_cast<double>(result.steps.size() - kUnsettledPlannedSteps);
}

TEST(FastestPlan, BetweenTheBoundAndEveryPolicyOnRandomSteps) {
  std::size_t faster_than_planned = 0;
  for_random_steps(
      20261207, 200,
      [&](const StepTrace& trace, const CostModel& model, const StepBound& bound, int round) {
        const FastestPlan fastest = fastest_known_plan(trace, model, kSteps);
        ASSERT_TRUE(fastest.result.ok()) << "round " << round;
        ASSERT_TRUE(no_step_below(fastest.result, bound.room_ns))
            << "round " << round << " " << fastest.describe();
        const SimResult planned = simulate(trace, model, SimPolicy::planned, kSteps);
        const SimResult belady = simulate(trace, model, SimPolicy::belady, kSteps);
        ASSERT_TRUE(planned.ok() && belady.ok()) << "round " << round;
        EXPECT_LE(fastest.steady_step_ns, mean_after_settling(planned)) << "round " << round;
        EXPECT_LE(fastest.steady_step_ns, mean_after_settling(belady)) << "round " << round;
        EXPECT_DOUBLE_EQ(fastest.steady_step_ns, mean_after_settling(fastest.result));
        if (fastest.steady_step_ns < 0.99 * mean_after_settling(planned)) ++faster_than_planned;
      });
  // The search is worth running: the planned policy's pick (bytes first) is
  // not always the fastest plan.
  EXPECT_GT(faster_than_planned, 0u);
}

// The options it reports are the ones that ran: simulating them again gives
// the same steps, and its description names them.
TEST(FastestPlan, ItsOptionsReproduceItsSteps) {
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    const auto [trace, model] = random_step(rng, kChunk);
    const FastestPlan fastest = fastest_known_plan(trace, model, kSteps);
    const SimResult again =
        fastest.result.policy == SimPolicy::belady
            ? simulate(trace, model, SimPolicy::belady, kSteps)
            : simulate(trace, model, SimPolicy::planned, kSteps, fastest.options);
    ASSERT_EQ(again.steps.size(), fastest.result.steps.size());
    for (std::size_t s = 0; s < again.steps.size(); ++s) {
      EXPECT_DOUBLE_EQ(again.steps[s].step_ns, fastest.result.steps[s].step_ns)
          << "round " << round << " " << fastest.describe() << " step " << s;
    }
    if (fastest.result.policy == SimPolicy::planned) {
      EXPECT_NE(
          fastest.describe().find("headroom " + std::to_string(fastest.options.headroom_reserve)),
          std::string::npos);
    }
  }
}

TEST(FastestPlan, AnOpThatDoesNotFitIsAnError) {
  StepTrace trace;
  trace.ops.push_back({"wide", 1000, 0, {{0, false}, {1, false}, {2, false}}});
  const CostModel model{2 * kChunk, kChunk, 0, 1e9, 1e9};
  EXPECT_THROW(fastest_known_plan(trace, model), PlanError);
}

}  // namespace
}  // namespace spillway::plan
