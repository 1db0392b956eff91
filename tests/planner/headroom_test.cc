// Headroom (PlanOptions::headroom_reserve): on a training-like step it
// shortens the simulated steady step at no cost in bytes, every plan with it
// stays valid, and choose_headroom_reserve refuses headroom that costs bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/headroom.h"
#include "tracer/planner/plan_check.h"
#include "tracer/planner/planner.h"

namespace spillway::plan {
namespace {

constexpr std::uint64_t kChunk = 1 << 20;
constexpr double kBandwidth = 1e12;  // one chunk in about 1 us

// A GPT-like step over `layers` layers: forward reads each layer's param
// chunk while activations (one chunk per layer) pile up, backward reads it
// and writes its grad chunk, then one optimizer op per layer writes the
// param and `state_chunks` optimizer-state chunks and reads the grad.
// Optimizer ops have no activations: that is room above the tightest moment.
StepTrace training_step(PlanChunk layers, PlanChunk state_chunks) {
  const PlanChunk grads = layers, states = 2 * layers;
  StepTrace trace;
  for (PlanChunk l = 0; l < layers; ++l) {
    trace.ops.push_back({"forward" + std::to_string(l), 1000, (l + 1) * kChunk, {{l, false}}});
  }
  for (PlanChunk l = layers; l-- > 0;) {
    trace.ops.push_back(
        {"backward" + std::to_string(l), 2000, (l + 1) * kChunk, {{l, false}, {grads + l, true}}});
  }
  for (PlanChunk l = 0; l < layers; ++l) {
    TracedOp op{"optimizer" + std::to_string(l), 500, 0, {{l, true}, {grads + l, false}}};
    for (PlanChunk s = 0; s < state_chunks; ++s)
      op.chunks.push_back({states + l * state_chunks + s, true});
    trace.ops.push_back(op);
  }
  return trace;
}

// Bytes and time over the steps after LRU's warmup and the first planned
// step (plans may cycle between residencies, so a sum rather than one step).
struct Steady {
  std::uint64_t bytes = 0;
  double ns = 0;
  double stall_ns = 0;
};

Steady steady(const SimResult& result) {
  Steady total;
  for (std::size_t s = 2; s < result.steps.size(); ++s) {
    total.bytes += result.steps[s].h2d_bytes + result.steps[s].d2h_bytes;
    total.ns += result.steps[s].step_ns;
    total.stall_ns += result.steps[s].stall_ns;
  }
  return total;
}

std::vector<PlanChunk> sweep(PlanChunk chunks) {
  std::vector<PlanChunk> sequence;
  for (PlanChunk chunk = 0; chunk < chunks; ++chunk) sequence.push_back(chunk);
  return sequence;
}

StepTrace single_chunk_trace(const std::vector<PlanChunk>& sequence) {
  StepTrace trace;
  for (PlanChunk chunk : sequence) {
    trace.ops.push_back({"op" + std::to_string(trace.ops.size()), 1000, 0, {{chunk, false}}});
  }
  return trace;
}

TEST(Headroom, ShortensTheSteadyStepWithoutMovingMoreBytes) {
  // Tightest moment: 19 - 6 chunks of activations; the optimizer has 19.
  const StepTrace trace = training_step(6, 3);
  const CostModel model{19 * kChunk, kChunk, 0, kBandwidth, kBandwidth};
  const auto run = [&](std::size_t headroom) {
    return simulate(trace, model, SimPolicy::planned, 14,
                    {.headroom_reserve = headroom, .choose_headroom = false});
  };
  const SimResult without = run(0), with = run(2);
  ASSERT_TRUE(without.ok() && with.ok());
  EXPECT_EQ(steady(with).bytes, steady(without).bytes);
  // Without headroom each optimizer op's fetches wait for the op before it
  // to end and then for their victims' write-backs.
  EXPECT_LT(steady(with).ns, 0.9 * steady(without).ns);
  EXPECT_LT(steady(with).stall_ns, steady(without).stall_ns);
  for (std::size_t headroom = 0; headroom <= 8; ++headroom) {
    const Plan plan = plan_steady(trace, model, {.headroom_reserve = headroom});
    ASSERT_EQ(check_plan(trace, model, plan), std::nullopt) << headroom;
  }
  // The default planned policy picks some headroom, and does as well.
  EXPECT_GE(choose_headroom_reserve(trace, model, {}), 1u);
  const SimResult chosen = simulate(trace, model, SimPolicy::planned, 14);
  EXPECT_EQ(steady(chosen).bytes, steady(without).bytes);
  EXPECT_LE(steady(chosen).ns, steady(with).ns);
}

TEST(Headroom, LeavesAStepWithEvenRoomAlone) {
  // Every moment is the tightest one: there is no room above it to spare.
  const StepTrace trace = single_chunk_trace(sweep(6));
  const CostModel model{4 * kChunk, kChunk};
  const Plan pure = plan_steady(trace, model);
  const Plan plan = plan_steady(trace, model, {.headroom_reserve = 3});
  EXPECT_EQ(plan.fetches, pure.fetches);
  EXPECT_EQ(plan.end, pure.end);
}

TEST(Headroom, IsRefusedWhenItCostsBytes) {
  // A cyclic sweep of 6 chunks; 4 fit except at op 0, where non-model bytes
  // leave 3. Headroom 1 would cap every moment at 3 and miss more often.
  StepTrace trace = single_chunk_trace(sweep(6));
  trace.ops[0].non_model_bytes = kChunk;
  const CostModel model{4 * kChunk, kChunk, 0, kBandwidth, kBandwidth};
  EXPECT_GT(plan_steady(trace, model, {.headroom_reserve = 1}).fetches,
            plan_steady(trace, model).fetches);
  EXPECT_EQ(choose_headroom_reserve(trace, model, {}), 0u);
}

}  // namespace
}  // namespace spillway::plan
