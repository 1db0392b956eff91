// Note [Steps found in the access stream] (allocator/policy/planned_policy.h):
// a program that never marks its steps is planned all the same once its step
// has run twice, each step's end counted by the policy (and not as a marked
// step); a program that marks its steps is planned from its marks exactly as
// before.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "allocator/policy/lru_policy.h"
#include "allocator/policy/planned_policy.h"
#include "tests/allocator/chunk/chunk_test_support.h"
#include "tests/allocator/policy/cache_model.h"
#include "tests/support/recording_trace_sink.h"

namespace spillway::testing {
namespace {

// Ten chunks, each read several times in a row, in a cycle: LRU misses on
// every chunk in six slots, Belady on fewer.
std::vector<int> layered_step() {
  std::vector<int> step;
  for (int c = 0; c < 10; ++c) step.insert(step.end(), {c, c, c, c, c});
  return step;
}

TEST(StepsFound, AnUnmarkedLoopIsFollowedOnceItsStepHasRunTwice) {
  const std::vector<int> step = layered_step();
  PlannedPolicy planned(1);
  CacheModel slots(planned, 6);
  LruPolicy lru;
  CacheModel lru_slots(lru, 6);
  // Found at the last access of the second step (the history spans the
  // coverage window by then).
  ASSERT_GE(2 * step.size(), PeriodDetector::kCoverageWindow);
  slots.run(step);
  EXPECT_STREQ(planned.state().phase, "tracing");
  slots.run(step);
  lru_slots.run(step);
  lru_slots.run(step);
  EXPECT_STREQ(planned.state().phase, "following");
  EXPECT_EQ(planned.state().plans_built, 1);
  EXPECT_EQ(planned.state().detected_period, static_cast<std::int64_t>(step.size()));
  // Each later step's first access ends the step before it.
  for (int s = 2; s < 8; ++s) {
    const CacheModel::Run planned_step = slots.run(step);
    const CacheModel::Run lru_step = lru_slots.run(step);
    EXPECT_LT(planned_step.misses, lru_step.misses) << "step " << s;
    EXPECT_EQ(planned_step.step_ends, std::vector<std::size_t>{0}) << "step " << s;
  }
  EXPECT_EQ(planned.state().planned_steps, 6);
  EXPECT_EQ(planned.state().divergences, 0);
}

TEST(StepsFound, ADepartureIsADivergenceAndTheNewLoopIsFoundWithoutAStepEnd) {
  const std::vector<int> step = layered_step();
  std::vector<int> other = step;  // another loop of the same length
  std::swap(other[20], other[45]);
  PlannedPolicy planned(1);
  CacheModel slots(planned, 6);
  for (int s = 0; s < 4; ++s) slots.run(step);
  ASSERT_STREQ(planned.state().phase, "following");
  for (int s = 0; s < 4; ++s) slots.run(other);
  EXPECT_STREQ(planned.state().phase, "following");
  EXPECT_EQ(planned.state().divergences, 1);
  EXPECT_EQ(planned.state().plans_built, 2);
  EXPECT_EQ(planned.state().detected_period, static_cast<std::int64_t>(other.size()));
}

TEST(StepsFound, AMarkedProgramIsPlannedFromItsWholeFirstStepWhateverDetectionDidInIt) {
  // A step with an inner loop that detection takes within the first step:
  // four micro-batches of the layered pass, then an update of every chunk.
  std::vector<int> step;
  for (int micro = 0; micro < 4; ++micro) {
    const std::vector<int> pass = layered_step();  // one micro-batch
    step.insert(step.end(), pass.begin(), pass.end());
  }
  for (int c = 0; c < 10; ++c) step.push_back(c);
  PlannedPolicy planned(1);
  CacheModel slots(planned, 6);
  slots.run(step);
  ASSERT_GE(planned.state().plans_built, 1) << "the inner loop was not taken: nothing to test";
  planned.on_step_end();
  // Counts restart from the mark, and the plan is the whole first step.
  EXPECT_STREQ(planned.state().phase, "following");
  EXPECT_EQ(planned.state().plans_built, 1);
  EXPECT_EQ(planned.state().divergences, 0);
  EXPECT_EQ(planned.state().detected_period, 0);
  for (int s = 0; s < 3; ++s) {
    const CacheModel::Run result = slots.run(step);
    EXPECT_TRUE(result.step_ends.empty()) << "a step end found although the program marks them";
    planned.on_step_end();
  }
  EXPECT_EQ(planned.state().planned_steps, 3);
  EXPECT_EQ(planned.state().divergences, 0);
}

// In the chunk manager: five chunk-sized tensors written in a cycle under a
// three-chunk budget, and nothing calls end_step.
struct UnmarkedRun {
  std::int64_t fetched_bytes = 0;  // over the last `measured` steps
  std::uint64_t steps_ended = 0;
  std::size_t step_marks = 0;  // in the trace
  PolicyState policy;
  bool intact = false;
};

UnmarkedRun run_unmarked(std::function<std::unique_ptr<EvictionPolicy>()> make_policy, int steps,
                         int measured) {
  RecordingTraceSink trace;
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  options.bandwidth_bytes_per_s = 0;  // instant copies: this test counts bytes
  options.copy_latency_ns = 0;
  options.make_policy = std::move(make_policy);
  options.trace = &trace;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  const std::size_t bytes = options.chunk_size;
  std::vector<TensorId> ids;
  std::vector<std::vector<std::uint8_t>> values;
  for (int i = 0; i < 5; ++i) ids.push_back(register_ok(chunks, model, bytes, "layer"));
  for (std::size_t i = 0; i < ids.size(); ++i) values.push_back(random_bytes(bytes, i));
  ChunkStats before;
  for (int step = 0; step < steps; ++step) {
    if (step == steps - measured) before = chunks.stats();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      values[i][step % bytes] ^= 0x5a;  // each use writes, as an update would
      write_on_device(chunks, ids[i], values[i]);
    }
  }
  chunks.synchronize();
  UnmarkedRun run;
  run.fetched_bytes = chunks.stats().bytes_moved_h2d - before.bytes_moved_h2d;
  run.steps_ended = chunks.steps_ended();
  run.step_marks = trace.of_kind(TraceEventKind::step).size();
  run.policy = chunks.policy_state();
  run.intact = true;
  for (std::size_t i = 0; i < ids.size(); ++i)
    run.intact = run.intact && read_on_host(chunks, ids[i], bytes) == values[i];
  return run;
}

TEST(StepsFound, InTheChunkManagerFoundStepsArePlannedNotMarkedAndMoveFewerBytesThanLru) {
  // 5 accesses a step: the coverage window is 13 steps; 30 steps, the last 10 measured.
  const UnmarkedRun lru = run_unmarked([] { return std::make_unique<LruPolicy>(); }, 30, 10);
  const UnmarkedRun planned =
      run_unmarked([] { return std::make_unique<PlannedPolicy>(1); }, 30, 10);
  EXPECT_TRUE(lru.intact);
  EXPECT_TRUE(planned.intact);
  EXPECT_EQ(lru.steps_ended, 0u);
  EXPECT_STREQ(planned.policy.phase, "following");
  EXPECT_EQ(planned.policy.detected_period, 5);
  EXPECT_GE(planned.policy.planned_steps, 10);
  // The program's steps, in the stats and the trace, are those it marks: none.
  EXPECT_EQ(planned.steps_ended, 0u);
  EXPECT_EQ(planned.step_marks, 0u);
  ASSERT_GT(lru.fetched_bytes, 0);
  EXPECT_LT(planned.fetched_bytes, lru.fetched_bytes);
  std::printf(
      "5 chunks in an unmarked cycle under 3: %llu steps found; last 10 steps fetched "
      "%lld bytes planned, %lld LRU\n",
      static_cast<unsigned long long>(planned.policy.planned_steps),
      static_cast<long long>(planned.fetched_bytes), static_cast<long long>(lru.fetched_bytes));
}

}  // namespace
}  // namespace spillway::testing
