// Note [Write-backs ahead of spills] (allocator/policy/planned_policy.h): the
// planned policy names the chunks the next expected spill will evict, and a
// spare, and the chunk manager writes the dirty ones back before the spill
// comes, so the spill frees them without a copy, every byte intact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <set>
#include <vector>

#include "allocator/policy/planned_policy.h"
#include "tests/allocator/chunk/chunk_test_support.h"
#include "tests/support/recording_trace_sink.h"

namespace spillway::testing {
namespace {

ChunkId chunk(int id) { return static_cast<ChunkId>(id); }

// Every resident chunk not named in `in_use` may be evicted.
class Resident final : public EvictionCandidates {
 public:
  explicit Resident(std::set<int> chunks) : chunks_(std::move(chunks)) {}
  bool evictable(ChunkId id) const override {
    return chunks_.count(static_cast<int>(id)) != 0 && in_use_.count(static_cast<int>(id)) == 0;
  }
  std::set<int> in_use_;

 private:
  std::set<int> chunks_;
};

struct Use {
  int chunk;
  bool writes;
};

void access(PlannedPolicy& policy, Use use) {
  policy.note_access_writes(use.writes);
  policy.on_access(chunk(use.chunk));
}

// A traced step of chunks 0..3 with a spill of `spilled` chunks before the
// fourth access: 0 (write), 1 (write), 2, [spill], 3, 2, 3.
const std::vector<Use> kStep = {{0, true},  {1, true},  {2, false},
                                {3, false}, {2, false}, {3, false}};
constexpr std::size_t kSpillBefore = 3;

PlannedPolicy traced_policy(std::size_t spilled) {
  PlannedPolicy policy(1);
  for (int id = 0; id < 4; ++id) policy.on_resident(chunk(id));
  for (std::size_t i = 0; i < kStep.size(); ++i) {
    if (i == kSpillBefore) policy.on_spill(spilled);
    access(policy, kStep[i]);
  }
  policy.on_step_end();
  return policy;
}

TEST(WriteBackAhead, TheVictimsAreBeladysAtTheTracedSpillOnceNothingWritesThemBeforeIt) {
  static_assert(PlannedPolicy::kSpareSpillVictims == 1, "the expectations name one spare");
  PlannedPolicy policy = traced_policy(1);
  ASSERT_STREQ(policy.state().phase, "following");
  const Resident all({0, 1, 2, 3});
  // From the spill (before the fourth access, chunk 3's), chunk 1 is next
  // used farthest (in the next step, after 0), then 0 (the spare); 2 and 3
  // at once, never named. Both are written before the spill, so neither is
  // named until its write is done, and the spare not before the spill's own.
  EXPECT_TRUE(policy.spill_victims_ahead(all).empty());
  access(policy, kStep[0]);  // 0 written: 1 still to be
  EXPECT_TRUE(policy.spill_victims_ahead(all).empty()) << "the spare waits for the spill's own";
  access(policy, kStep[1]);
  EXPECT_EQ(policy.spill_victims_ahead(all), (std::vector<ChunkId>{chunk(1), chunk(0)}));
  // A chunk in use now is not named, nor replaced by one the spill keeps.
  Resident busy({0, 1, 2, 3});
  busy.in_use_ = {1};
  EXPECT_TRUE(policy.spill_victims_ahead(busy).empty());
  access(policy, kStep[2]);
  EXPECT_EQ(policy.spill_victims_ahead(all), (std::vector<ChunkId>{chunk(1), chunk(0)}));
}

// A followed step that spills elsewhere than the traced one moves the
// expectation there; one that spills nowhere leaves it.
TEST(WriteBackAhead, TheSpillsExpectedAreTheLatestFollowedStepsThatSpilled) {
  PlannedPolicy policy = traced_policy(1);
  const Resident all({0, 1, 2, 3});
  // At the step's start the traced spill's victims, 1 and 0, are both
  // written before it: nothing is named.
  ASSERT_TRUE(policy.spill_victims_ahead(all).empty());
  constexpr std::size_t kFollowedSpillBefore = 5;  // chunk 3's second access
  for (std::size_t i = 0; i < kStep.size(); ++i) {
    if (i == kFollowedSpillBefore) policy.on_spill(1);
    access(policy, kStep[i]);
  }
  policy.on_step_end();
  ASSERT_STREQ(policy.state().phase, "following");
  // From before access 5, chunk 2 is next used farthest (third in the next
  // step), then 1 (the spare); 1 is written before it, 2 is not.
  EXPECT_EQ(policy.spill_victims_ahead(all), (std::vector<ChunkId>{chunk(2)}));
  for (std::size_t i = 0; i < kStep.size(); ++i) access(policy, kStep[i]);
  policy.on_step_end();
  EXPECT_EQ(policy.spill_victims_ahead(all), (std::vector<ChunkId>{chunk(2)}))
      << "a step without a spill keeps the expectation";
  for (std::size_t i = 0; i < 3; ++i) access(policy, kStep[i]);
  EXPECT_EQ(policy.spill_victims_ahead(all), (std::vector<ChunkId>{chunk(2), chunk(1)}));
}

TEST(WriteBackAhead, NothingIsNamedWithoutATracedSpillOrOffThePlan) {
  const Resident all({0, 1, 2, 3});
  PlannedPolicy without = traced_policy(0);
  ASSERT_STREQ(without.state().phase, "following");
  EXPECT_TRUE(without.spill_victims_ahead(all).empty()) << "no spill in the traced step";

  PlannedPolicy tracing(2);
  for (int id = 0; id < 4; ++id) tracing.on_resident(chunk(id));
  access(tracing, kStep[0]);
  tracing.on_spill(1);
  EXPECT_TRUE(tracing.spill_victims_ahead(all).empty()) << "still tracing";

  PlannedPolicy diverged = traced_policy(1);
  access(diverged, kStep[0]);
  access(diverged, {3, false});  // the plan expects 1 next: the rest of the step is traced
  EXPECT_STREQ(diverged.state().phase, "tracing");
  EXPECT_TRUE(diverged.spill_victims_ahead(all).empty());
}

// In the chunk manager: four 2 MiB chunks and, before the fourth access of
// each step, a 1 MiB activation that does not fit beside them, so it spills
// one chunk. The step writes chunks 0 and 1 and reads 2 and 3; Belady's
// victim at the spill is chunk 1, dirty. Planned, its write-back starts at
// its release, before chunk 2 is even acquired; the spill then drops a clean
// chunk. Every byte survives the moves.
struct SpillRun {
  int steps_with_write_back_ahead = 0;  // of the four followed steps
  int spills = 0;
  std::int64_t writebacks = 0;
  bool bytes_intact = true;
};

constexpr int kSteps = 6;

SpillRun run_spilling_steps(bool planned_prefetch) {
  RecordingTraceSink trace;
  ChunkRigOptions options;
  options.allocator_budget = 9 * MiB;  // four chunks and a small slab do not fit
  options.bandwidth_bytes_per_s = 2e9;
  options.planned_prefetch = planned_prefetch;
  options.trace = &trace;
  options.make_policy = [] { return std::make_unique<PlannedPolicy>(1); };
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  std::vector<TensorId> ids;
  std::vector<std::uint64_t> chunk_ids;  // each tensor's chunk, as the trace names it
  std::vector<std::vector<std::uint8_t>> expected;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(register_ok(chunks, model, options.chunk_size, "t" + std::to_string(i)));
    expected.push_back(random_bytes(options.chunk_size, 100 + i));
    write_on_device(chunks, ids.back(), expected.back());
    chunk_ids.push_back(trace.of_kind(TraceEventKind::chunk_access).back().address);
  }
  chunks.end_step();  // traced: the plan of these writes departs in the next step, retraced

  SpillRun run;
  for (int step = 0; step < kSteps; ++step) {
    const std::size_t events_before = trace.events().size();
    for (std::size_t i = 0; i < kStep.size(); ++i) {
      if (i == kSpillBefore) {
        void* activation = nullptr;
        EXPECT_EQ(rig.allocator->allocate(&activation, MiB, Stream{}), Status::ok)
            << CachingAllocator::last_error();
        EXPECT_EQ(rig.allocator->deallocate(activation), Status::ok);
      }
      const TensorId id = ids[static_cast<std::size_t>(kStep[i].chunk)];
      if (kStep[i].writes) {
        expected[static_cast<std::size_t>(kStep[i].chunk)] =
            random_bytes(options.chunk_size, 1000 * step + i);
        write_on_device(chunks, id, expected[static_cast<std::size_t>(kStep[i].chunk)]);
      } else if (!equal_on_device(chunks, id, expected[static_cast<std::size_t>(kStep[i].chunk)])) {
        run.bytes_intact = false;
      }
    }
    chunks.end_step();
    // Step 1 is traced again (step 0 departs from the writes' plan); from
    // step 2 on, did chunk 1's write-back come before chunk 2's first access?
    if (step < 2) continue;
    const std::vector<TraceEvent> events = trace.events();
    bool written_back = false;
    for (std::size_t e = events_before; e < events.size(); ++e) {
      const TraceEvent& event = events[e];
      if (event.kind == TraceEventKind::chunk_writeback && event.address == chunk_ids[1])
        written_back = true;
      if (event.kind == TraceEventKind::chunk_access && event.address == chunk_ids[2]) break;
    }
    if (written_back) ++run.steps_with_write_back_ahead;
  }
  run.spills = static_cast<int>(rig.allocator->stats().num_spills_for_allocation);
  run.writebacks = chunks.stats().writebacks;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (read_on_host(chunks, ids[i], options.chunk_size) != expected[i]) run.bytes_intact = false;
  return run;
}

TEST(WriteBackAhead, TheChunkManagerWritesTheSpillsVictimBackBeforeTheSpill) {
  const SpillRun planned = run_spilling_steps(/*planned_prefetch=*/true);
  const SpillRun off = run_spilling_steps(/*planned_prefetch=*/false);
  std::printf(
      "4 chunks, a spilling activation per step: write-back ahead in %d of 4 planned steps "
      "(%d with prefetch:off); spills %d and %d, write-backs %lld and %lld\n",
      planned.steps_with_write_back_ahead, off.steps_with_write_back_ahead, planned.spills,
      off.spills, static_cast<long long>(planned.writebacks),
      static_cast<long long>(off.writebacks));
  EXPECT_EQ(planned.steps_with_write_back_ahead, 4);
  EXPECT_EQ(off.steps_with_write_back_ahead, 0) << "without the plan's moves, at the spill";
  EXPECT_GE(planned.spills, 6) << "every step spills: the activation does not fit beside";
  // Each victim is written back either way; the spare (chunk 0, Belady's
  // next choice) is written back too, and written again, once a step.
  EXPECT_GE(planned.writebacks, off.writebacks);
  EXPECT_LE(planned.writebacks, off.writebacks + kSteps);
  EXPECT_TRUE(planned.bytes_intact);
  EXPECT_TRUE(off.bytes_intact);
}

}  // namespace
}  // namespace spillway::testing
