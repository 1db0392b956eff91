// Cost simulator: static fails or moves nothing, the planned policy moves no
// more than LRU and no less than offline Belady, and hides copies behind
// compute when the bandwidth allows. Times are modelled, never measured.
#include <gtest/gtest.h>

#include "tracer/planner/cost_simulator.h"

namespace spillway::plan {
namespace {

constexpr std::uint64_t kChunk = 1 << 20;

// A forward sweep reading chunks 0..n-1, a backward sweep writing them.
StepTrace forward_backward(PlanChunk chunks, std::uint64_t op_ns) {
  StepTrace trace;
  for (PlanChunk c = 0; c < chunks; ++c) {
    trace.ops.push_back({"fwd" + std::to_string(c), op_ns, 0, {{c, false}}});
  }
  for (PlanChunk c = chunks; c-- > 0;) {
    trace.ops.push_back({"bwd" + std::to_string(c), 2 * op_ns, 0, {{c, true}}});
  }
  return trace;
}

TEST(CostSimulator, StaticFailsWhenTheModelDoesNotFit) {
  const SimResult result =
      simulate(forward_backward(8, 1000), {4 * kChunk, kChunk}, SimPolicy::static_residency, 2);
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.error.find("8388608 bytes of chunks"), std::string::npos) << result.error;
}

TEST(CostSimulator, StaticMovesNothingWhenItFits) {
  const SimResult result =
      simulate(forward_backward(4, 1000), {4 * kChunk, kChunk}, SimPolicy::static_residency, 3);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.total().h2d_bytes, 0u);
  EXPECT_EQ(result.last().step_ns, 12000.0);
}

TEST(CostSimulator, PlannedMovesNoMoreThanLruAndNoLessThanBelady) {
  const StepTrace trace = forward_backward(12, 1000);
  const CostModel model{5 * kChunk, kChunk, 0, 1e9, 1e9};
  const std::size_t steps = 6;
  const SimResult planned = simulate(trace, model, SimPolicy::planned, steps);
  const SimResult lru = simulate(trace, model, SimPolicy::lru, steps);
  const SimResult belady = simulate(trace, model, SimPolicy::belady, steps);
  ASSERT_TRUE(planned.ok() && lru.ok() && belady.ok());
  const auto moved = [](const SimResult& r) { return r.total().h2d_bytes + r.total().d2h_bytes; };
  EXPECT_LE(moved(planned), moved(lru));
  EXPECT_LE(planned.total().h2d_bytes, lru.total().h2d_bytes);
  EXPECT_GE(planned.total().h2d_bytes, belady.total().h2d_bytes);
  EXPECT_EQ(planned.steps.size(), steps);
}

TEST(CostSimulator, PrefetchHidesCopiesWhenBandwidthAllows) {
  // Copies of 0.1 ms beside ops of 1 ms: the steady planned step never stalls.
  const StepTrace trace = forward_backward(8, 1'000'000);
  const CostModel model{4 * kChunk, kChunk, 0, 10e9, 10e9};
  const SimResult planned = simulate(trace, model, SimPolicy::planned, 4);
  ASSERT_TRUE(planned.ok()) << planned.error;
  EXPECT_EQ(planned.last().stall_ns, 0.0);
  EXPECT_GT(planned.last().h2d_bytes, 0u);
  const SimResult lru = simulate(trace, model, SimPolicy::lru, 4);
  EXPECT_GT(lru.last().stall_ns, 0.0);
}

// forward_backward, with each backward op also writing a gradient chunk of
// its own, fresh each step (discarded after it) or not.
StepTrace with_gradients(bool fresh) {
  StepTrace trace = forward_backward(6, 1'000'000);
  for (TracedOp& op : trace.ops) {
    if (!op.name.starts_with("bwd")) continue;
    op.chunks.push_back({static_cast<PlanChunk>(10 + op.chunks[0].chunk), true, fresh});
  }
  return trace;
}

// planner.h, dead bytes: chunks rewritten from zeros each step cost no
// write-back when they leave and no copy when they come back, under every
// policy, and so the bound's traffic is smaller too.
TEST(CostSimulator, FreshChunksAreZeroedNotCopied) {
  const StepTrace fresh = with_gradients(true);
  const StepTrace kept = with_gradients(false);
  const CostModel model{4 * kChunk, kChunk, 0, 1e9, 1e9};
  for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
    const SimResult zeroed = simulate(fresh, model, policy, 4);
    const SimResult copied = simulate(kept, model, policy, 4);
    ASSERT_TRUE(zeroed.ok() && copied.ok()) << policy_name(policy);
    EXPECT_LT(zeroed.last().h2d_bytes, copied.last().h2d_bytes) << policy_name(policy);
    EXPECT_LT(zeroed.last().d2h_bytes, copied.last().d2h_bytes) << policy_name(policy);
  }
  EXPECT_LT(step_bound(fresh, model).h2d_bytes, step_bound(kept, model).h2d_bytes);
}

TEST(CostSimulator, BoundIsComputeOrCopyTime) {
  const StepTrace trace = forward_backward(8, 1000);
  const CostModel model{4 * kChunk, kChunk, 0, 1e9, 1e9};
  const StepBound bound = step_bound(trace, model);
  EXPECT_EQ(bound.compute_ns, 24000.0);
  EXPECT_GT(bound.h2d_bytes, 0u);
  EXPECT_GE(bound.bound_ns, bound.compute_ns);
  EXPECT_GE(bound.bound_ns, model.h2d_ns(bound.h2d_bytes));
}

}  // namespace
}  // namespace spillway::plan
