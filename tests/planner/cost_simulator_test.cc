// Cost simulator: static fails or moves nothing, the planned policy moves no
// more than LRU and no less than offline Belady, and hides copies behind
// compute when the bandwidth allows. Times are modelled, never measured.
#include <gtest/gtest.h>

#include <random>

#include "tests/planner/bound_property.h"
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

// Note [A bound that knows room]: a forward of eight compute-heavy ops,
// then an optimizer that updates every chunk beside state that leaves room
// for two. The copies could hide behind the forward, but the six chunks
// the optimizer's phase cannot hold at its start must move during it.
TEST(CostSimulator, BoundCountsTheCopiesRoomForcesIntoAPhase) {
  StepTrace trace;
  for (PlanChunk c = 0; c < 8; ++c) {
    trace.ops.push_back({"fwd" + std::to_string(c), 4000, 0, {{c, false}}});
  }
  for (PlanChunk c = 0; c < 8; ++c) {
    trace.ops.push_back({"opt" + std::to_string(c), 100, 2 * kChunk, {{c, true}}});
  }
  const double chunk_per_us = static_cast<double>(kChunk) * 1e6;  // a copy takes 1000 ns
  const CostModel model{4 * kChunk, kChunk, 0, chunk_per_us, chunk_per_us};
  const StepBound bound = step_bound(trace, model);
  EXPECT_EQ(bound.compute_ns, 32800.0);
  EXPECT_EQ(bound.flat_ns, 32800.0);  // the link's bytes fit behind the compute
  // Note [The first copy into a full stretch]: the first copy waits for op 8
  // to be done with chunk 0, and op 15 runs after the last one.
  EXPECT_EQ(bound.room_ns, 32000.0 + 100.0 + 6 * 1000.0 + 100.0);
  EXPECT_EQ(bound.bound_ns, bound.room_ns);
  for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
    const SimResult simulated = simulate(trace, model, policy, 4);
    ASSERT_TRUE(simulated.ok()) << policy_name(policy) << ": " << simulated.error;
    for (const StepCost& step : simulated.steps) {
      EXPECT_GE(step.step_ns, bound.room_ns) << policy_name(policy);
    }
  }
}

// Note [The first copy into a full stretch]: an optimizer that updates each
// pair of chunks twice beside room for two. A stretch that starts with two
// of its chunks on the device can copy in the others only once one of those
// is done, and its ops after the last copy's use still run. (That a chunk whose bytes die may leave
// at its death is checked by FastestPlan.BetweenTheBoundAndEveryPolicyOnRandomSteps, which fails
// without it.)
TEST(CostSimulator, BoundWaitsForTheFirstSlotOfAFullStretch) {
  StepTrace trace;
  for (PlanChunk c = 0; c < 8; ++c) {
    trace.ops.push_back({"fwd" + std::to_string(c), 4000, 0, {{c, false}}});
  }
  for (PlanChunk pair = 0; pair < 8; pair += 2) {
    for (int round = 0; round < 2; ++round) {
      trace.ops.push_back({"opt", 100, 2 * kChunk, {{pair, true}}});
      trace.ops.push_back({"opt", 100, 2 * kChunk, {{pair + 1, true}}});
    }
  }
  const double chunk_per_us = static_cast<double>(kChunk) * 1e6;  // a copy takes 1000 ns
  const CostModel model{4 * kChunk, kChunk, 0, chunk_per_us, chunk_per_us};
  const StepBound bound = step_bound(trace, model);
  // The best cut: the forward (32000), then ops 8-13, 14-17 and 18-23, each
  // holding two of its four chunks at its start. Two copies each, the first
  // once a held chunk is done (after ops 8-10, 14, 18), the ops after the
  // last copy's first use still to run (13, 17, 21-23): 32000 + (2000 + 300
  // + 100) + (2000 + 100 + 100) + (2000 + 100 + 300). Without the wait and
  // the tail, the bound was 38400.
  EXPECT_EQ(bound.room_ns, 39000.0);
  for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
    const SimResult simulated = simulate(trace, model, policy, 4);
    ASSERT_TRUE(simulated.ok()) << policy_name(policy) << ": " << simulated.error;
    EXPECT_TRUE(no_step_below(simulated, bound.room_ns)) << policy_name(policy);
  }
}

// Note [An op waits for the room it takes]: an op whose non-model bytes
// leave room for no chunk evicts the chunk the op before wrote, and starts
// only once its write-back has ended (the allocator's spill wait), under
// every policy. The bound's write-back term sees the same copy.
TEST(CostSimulator, AnOpWaitsForTheRoomItsDirtyVictimStillHolds) {
  StepTrace trace;
  trace.ops.push_back({"write", 100, 0, {{0, true}}});
  trace.ops.push_back({"temporaries", 100, 2 * kChunk, {}});
  const double chunk_per_us = static_cast<double>(kChunk) * 1e6;  // a copy takes 1000 ns
  const CostModel model{2 * kChunk, kChunk, 0, chunk_per_us, chunk_per_us};
  for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
    const SimResult simulated = simulate(trace, model, policy, 4);
    ASSERT_TRUE(simulated.ok()) << policy_name(policy) << ": " << simulated.error;
    for (const StepCost& step : simulated.steps) {
      // Fetch 1000 (stalled), write 100, write-back 1000 (waited), 100.
      EXPECT_EQ(step.stall_ns, 1000.0) << policy_name(policy);
      EXPECT_EQ(step.spill_wait_ns, 1000.0) << policy_name(policy);
      EXPECT_EQ(step.step_ns, 2200.0) << policy_name(policy);
    }
  }
  EXPECT_EQ(step_bound(trace, model).room_ns, 1000.0);  // the write-back, in [0, 2)
}

// Note [A bound that knows room], the write-backs: a backward writes four
// fresh gradient chunks beside activations that leave room for one, then an
// op reads all four and a long one follows. Chunks 0 and 1 cannot both be
// on the device when op 2 starts, so one is written back during ops 0-1;
// chunks 0-2 come back for op 4 after op 3 begins. The link's bytes fit
// behind the long op, which the flat term assumes.
TEST(CostSimulator, BoundCountsTheWriteBacksRoomForcesIntoAPhase) {
  StepTrace trace;
  for (PlanChunk c = 0; c < 4; ++c) {
    trace.ops.push_back({"bwd" + std::to_string(c), 100, 3 * kChunk, {{c, true, true}}});
  }
  trace.ops.push_back({"reduce", 100, 0, {{0, false}, {1, false}, {2, false}, {3, false}}});
  trace.ops.push_back({"long", 10000, 0, {}});
  const double chunk_per_us = static_cast<double>(kChunk) * 1e6;  // a copy takes 1000 ns
  const CostModel model{4 * kChunk, kChunk, 0, chunk_per_us, chunk_per_us};
  const StepBound bound = step_bound(trace, model);
  EXPECT_EQ(bound.compute_ns, 10500.0);
  EXPECT_EQ(bound.flat_ns, 10500.0);
  // [0, 3): chunks 0 and 1 live at op 2, room for one: 1000; [3, 5): chunks
  // 0-2 beyond op 3's one: 2000, the first of them once op 4 brings room
  // (100 ns in) and op 4 after the last (Note [The first copy into a full
  // stretch]); [5, 6): 10000.
  EXPECT_EQ(bound.room_ns, 1000.0 + 2000.0 + 200.0 + 10000.0);
  for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
    const SimResult simulated = simulate(trace, model, policy, 4);
    ASSERT_TRUE(simulated.ok()) << policy_name(policy) << ": " << simulated.error;
    for (const StepCost& step : simulated.steps) {
      EXPECT_GE(step.step_ns, bound.room_ns) << policy_name(policy);
    }
  }
}

// The room term bounds every step, not only the average of steady ones
// (a step's last copies can run on into the next, which the flat term's
// bytes over bandwidth does not see): on random traces (non-model peaks
// that squeeze the room, fresh chunks, both directions' bandwidths), no
// policy's step, from whatever residency it starts, is shorter.
TEST(CostSimulator, NoPolicyBeatsTheBoundOnRandomTraces) {
  std::size_t tighter = 0;
  for_random_steps(
      20261206, 300,
      [&](const StepTrace& trace, const CostModel& model, const StepBound& bound, int round) {
        if (bound.room_ns > bound.flat_ns) ++tighter;
        for (SimPolicy policy : {SimPolicy::planned, SimPolicy::lru, SimPolicy::belady}) {
          const SimResult simulated = simulate(trace, model, policy, 4);
          ASSERT_TRUE(simulated.ok())
              << "round " << round << " " << policy_name(policy) << ": " << simulated.error;
          ASSERT_TRUE(no_step_below(simulated, bound.room_ns))
              << "round " << round << " " << policy_name(policy);
        }
      });
  EXPECT_GT(tighter, 0u);  // the cases test the room term, not only the flat one
}

}  // namespace
}  // namespace spillway::plan
