// Note [Prefetch timed by op durations] (allocator/policy/prefetch_timing.h):
// the start decision on its own; in the planned policy, the fetch start
// points a traced step's op durations and a copy bandwidth give, held back
// until the latest start, queued behind earlier fetches, early enough for
// the fetches queued behind it, and today's
// start-at-once when durations or bandwidth are unknown; with activations
// sharing the device, a fetch that would force an extra spill waits, and one
// that a traced rise of activations would spill waits until the rise is
// behind it (Note [Room a prefetch takes early]); in the chunk manager on the
// simulated device, the stalls it expects and measures.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "allocator/policy/planned_policy.h"
#include "allocator/policy/prefetch_timing.h"
#include "tests/allocator/chunk/chunk_test_support.h"

namespace spillway::testing {
namespace {

constexpr std::uint64_t kMs = 1'000'000;

ChunkId chunk(int id) { return static_cast<ChunkId>(id); }

TEST(PrefetchTiming, StartsOnlyWhenTheNextPointWouldBeTooLate) {
  FetchTiming timing{.now_ns = 0,
                     .next_decision_ns = 1 * kMs,
                     .use_ns = 10 * kMs,
                     .stream_free_at_ns = 0,
                     .copy_ns = 2 * kMs};
  EXPECT_FALSE(must_start_now(timing)) << "started at 1 ms it still lands at 3.5 ms";
  timing.next_decision_ns = 8 * kMs;
  EXPECT_TRUE(must_start_now(timing)) << "at 8 ms, 2 ms plus the margin ends past 10 ms";
  timing.next_decision_ns = 1 * kMs;
  timing.stream_free_at_ns = 8 * kMs;
  EXPECT_TRUE(must_start_now(timing)) << "queued behind fetches that end at 8 ms";
  timing.stream_free_at_ns = 0;
  timing.next_decision_ns = 0;
  EXPECT_TRUE(must_start_now(timing)) << "no later point to wait for";
}

TEST(PrefetchTiming, ExpectedStallIsTheLatenessOfAStartNow) {
  const FetchTiming timing{.now_ns = 5 * kMs,
                           .next_decision_ns = 6 * kMs,
                           .use_ns = 7 * kMs,
                           .stream_free_at_ns = 6 * kMs,
                           .copy_ns = 3 * kMs};
  EXPECT_EQ(arrival_ns(timing, timing.now_ns), 9 * kMs);
  EXPECT_EQ(expected_stall_ns(timing), 2 * kMs);
  FetchTiming in_time = timing;
  in_time.use_ns = 20 * kMs;
  EXPECT_EQ(expected_stall_ns(in_time), 0u);
}

// The chunk manager's clock, as the test sets it.
struct FakeClock final : CopyClock {
  std::uint64_t now = 0;
  std::uint64_t free_at = 0;
  std::optional<std::uint64_t> copy;  // every chunk's; nullopt: bandwidth unknown
  std::uint64_t now_ns() const override { return now; }
  std::uint64_t stream_free_at_ns(ChunkId) const override { return free_at; }
  bool queues_on_fetch_stream(ChunkId) const override { return true; }
  bool copies_modelled() const override { return copy.has_value(); }
  std::optional<std::uint64_t> fetch_ns(ChunkId) const override { return copy; }
  // Note [Room a prefetch takes early]: unlimited unless the test says.
  std::uint64_t room = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t room_bytes(ChunkId) const override { return room; }
  std::uint64_t non_model = 0;
  std::uint64_t non_model_bytes() const override { return non_model; }
  bool fits = true;
  bool fits_without_eviction(ChunkId) const override { return fits; }
};

// Where each prefetch started: -1 at the step's end before the step, i after
// the step's access i; and the stall each was expected to cost.
struct StartPoints {
  std::map<int, int> started_after;
  std::map<int, std::uint64_t> expected_stall_ns;
};

// Starts, the way the chunk manager does, every prefetch the policy wants now.
void start_prefetches(const PlannedPolicy& policy, FakeClock& clock, int point,
                      StartPoints& points) {
  while (const std::optional<PlannedFetch> fetch = policy.timed_prefetch(clock)) {
    const int id = static_cast<int>(fetch->chunk);
    points.started_after[id] = point;
    points.expected_stall_ns[id] = fetch->expected_stall_ns;
    if (clock.copy) clock.free_at = std::max(clock.free_at, clock.now) + *clock.copy;
    const_cast<PlannedPolicy&>(policy).on_resident(fetch->chunk);
  }
}

// Traces one step of chunks 0..count-1, access i at i ms (1 ms ops), ending
// at count ms; then follows the next step the same way with `absent` off the
// device, and returns where their prefetches started.
StartPoints follow_after_trace(PlannedPolicy& policy, FakeClock& clock, int count,
                               const std::set<int>& absent, bool stamp_times = true) {
  auto access_at = [&](int id, std::uint64_t time) {
    clock.now = time;
    if (stamp_times) policy.note_time(time);
    policy.on_access(chunk(id));
  };
  for (int id = 0; id < count; ++id) {
    policy.on_resident(chunk(id));
    access_at(id, static_cast<std::uint64_t>(id) * kMs);
  }
  clock.now = static_cast<std::uint64_t>(count) * kMs;
  if (stamp_times) policy.note_time(clock.now);
  policy.on_step_end();
  EXPECT_STREQ(policy.state().phase, "following");
  for (int id : absent) policy.on_evicted(chunk(id));
  StartPoints points;
  const std::uint64_t step_start = clock.now;
  start_prefetches(policy, clock, -1, points);
  for (int id = 0; id < count; ++id) {
    access_at(id, step_start + static_cast<std::uint64_t>(id) * kMs);
    start_prefetches(policy, clock, id, points);
  }
  return points;
}

TEST(PrefetchTiming, AFetchArrivesByTheLatestStartOfTheFetchesBehindIt) {
  EXPECT_EQ(latest_start_behind({}), std::numeric_limits<std::uint64_t>::max());
  // Copies of 2 ms take 2.5 ms + 20 us with the margin.
  const std::uint64_t margined = margined_copy_ns(2 * kMs);
  EXPECT_EQ(margined, 2520 * 1000u);
  // One behind, used at 10 ms: it must start by 10 ms less its copy.
  EXPECT_EQ(latest_start_behind({{10 * kMs, 2 * kMs}}), 10 * kMs - margined);
  // Two used back to back at 10 and 11 ms: the second must start by 11 ms
  // less its copy, before the first's use, so the first must start a copy
  // earlier still.
  EXPECT_EQ(latest_start_behind({{10 * kMs, 2 * kMs}, {11 * kMs, 2 * kMs}}),
            11 * kMs - 2 * margined);
  // Far apart, each only by its own use.
  EXPECT_EQ(latest_start_behind({{10 * kMs, 2 * kMs}, {30 * kMs, 2 * kMs}}), 10 * kMs - margined);
  EXPECT_EQ(latest_start_behind({{1 * kMs, 2 * kMs}}), 0u) << "too late at any start";
}

TEST(PlannedPolicyTiming, AFetchStartsAtTheLatestAccessThatStillLandsItBeforeItsUse) {
  // Chunk 6, used 6 ms into the step, copies in 1.5 ms.
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 1500 * 1000;
  const StartPoints points = follow_after_trace(policy, clock, 8, {6});
  // After access 3 (3 ms), starting after access 4 (4 ms) still lands 6 at
  // 4 + 1.5 * 1.25 < 6 ms; after access 4 the next point (5 ms) is too late.
  EXPECT_EQ(points.started_after.at(6), 4);
  EXPECT_EQ(points.expected_stall_ns.at(6), 0u);
}

TEST(PlannedPolicyTiming, AFetchLeavesTheFetchQueuedBehindItTimeToLand) {
  // Chunks 6 and 7, used 6 and 7 ms into the step, copy in 1.5 ms each, on
  // one FIFO stream. 7 must start by 7 - 1.895 = 5.105 ms, so 6 must land by
  // then: started at 4 ms it would land at 5.895 with the margin, so it
  // starts after access 3. 7 then waits until its own latest point, after
  // access 5 (5 ms), and lands at 6.5 ms.
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 1500 * 1000;
  const StartPoints points = follow_after_trace(policy, clock, 8, {6, 7});
  EXPECT_EQ(points.started_after.at(6), 3);
  EXPECT_EQ(points.started_after.at(7), 5);
  EXPECT_EQ(points.expected_stall_ns.at(6), 0u);
  EXPECT_EQ(points.expected_stall_ns.at(7), 0u);
}

TEST(PlannedPolicyTiming, LongerCopiesStartEarlierAndALateOneExpectsItsStall) {
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 3 * kMs;
  const StartPoints points = follow_after_trace(policy, clock, 8, {6});
  // Started after access 3 (3 ms), 3 ms * 1.25 would end past 6 ms: after 2.
  EXPECT_EQ(points.started_after.at(6), 2);
  PlannedPolicy slow_policy(1);
  FakeClock slow;
  slow.copy = 7 * kMs;
  const StartPoints late = follow_after_trace(slow_policy, slow, 8, {6});
  EXPECT_EQ(late.started_after.at(6), -1) << "it cannot make it: it starts at once";
  EXPECT_EQ(late.expected_stall_ns.at(6), 1 * kMs) << "8 + 7 ms against the use at 8 + 6 ms";
}

TEST(PlannedPolicyTiming, UnknownDurationsOrBandwidthStartEveryFetchAtOnceAsBefore) {
  PlannedPolicy unstamped(1);
  FakeClock clock;
  clock.copy = 1500 * 1000;
  const StartPoints no_durations =
      follow_after_trace(unstamped, clock, 8, {6, 7}, /*stamp_times=*/false);
  EXPECT_FALSE(unstamped.timed());
  EXPECT_EQ(no_durations.started_after.at(6), -1);
  EXPECT_EQ(no_durations.started_after.at(7), -1);

  PlannedPolicy stamped(1);
  FakeClock no_bandwidth;  // copy unknown
  const StartPoints untimed = follow_after_trace(stamped, no_bandwidth, 8, {6, 7});
  EXPECT_TRUE(stamped.timed());
  EXPECT_EQ(untimed.started_after.at(6), -1);
  EXPECT_EQ(untimed.started_after.at(7), -1);
}

TEST(PlannedPolicyTiming, AFetchTakesNoRoomBeforeItsLatestStart) {
  // Budget for 7 of the 8 chunks, 6 absent: an untimed prefetch takes the
  // free room at the step's start, through every op before 6's use (where
  // activations need it); the timed one leaves it free until after access 4.
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 1500 * 1000;
  const StartPoints points = follow_after_trace(policy, clock, 8, {6});
  EXPECT_EQ(points.started_after.at(6), 4);
  PlannedPolicy untimed(1);
  FakeClock unknown;
  EXPECT_EQ(follow_after_trace(untimed, unknown, 8, {6}).started_after.at(6), -1);
}

TEST(PlannedPolicyTiming, TheNextStepIsPredictedFromTheTracedStepLength) {
  // After a followed step (accesses at 8..15 ms), chunk 1 leaves; its next
  // use is 1 ms into the next step, predicted at 15 + (8 - 7) + 1 = 17 ms.
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 500 * 1000;
  follow_after_trace(policy, clock, 8, {});
  policy.on_evicted(chunk(1));
  StartPoints points;
  start_prefetches(policy, clock, 7, points);
  EXPECT_EQ(points.started_after.count(1), 0u) << "from 16 ms, 0.5 ms still lands by 17 ms";
  clock.now = 16 * kMs;  // the step ends; the next access (0) comes at once
  policy.note_time(clock.now);
  policy.on_step_end();
  start_prefetches(policy, clock, -1, points);
  EXPECT_EQ(points.started_after.at(1), -1) << "access 0 is now: no later point before 1";
}

// Traces `sequence` (access i at i ms) with the non-model bytes at each
// access (also their most since the access before), then follows the next
// step the same way with `absent` off the device, and returns where their
// prefetches started (Note [Room a prefetch takes early]).
StartPoints follow_with_non_model(PlannedPolicy& policy, FakeClock& clock,
                                  const std::vector<int>& sequence,
                                  const std::vector<std::uint64_t>& non_model,
                                  const std::set<int>& absent) {
  auto access_at = [&](std::size_t i, std::uint64_t time) {
    clock.now = time;
    policy.note_time(time);
    policy.note_non_model_high_water(non_model[i]);
    clock.non_model = non_model[i];
    policy.on_access(chunk(sequence[i]));
  };
  for (int id : sequence) policy.on_resident(chunk(id));
  for (std::size_t i = 0; i < sequence.size(); ++i) access_at(i, i * kMs);
  clock.now = sequence.size() * kMs;
  policy.note_time(clock.now);
  policy.on_step_end();
  clock.non_model = 0;  // the step's activations are gone at its end
  for (int id : absent) policy.on_evicted(chunk(id));
  StartPoints points;
  const std::uint64_t step_start = clock.now;
  start_prefetches(policy, clock, -1, points);
  for (std::size_t i = 0; i < sequence.size(); ++i) {
    access_at(i, step_start + i * kMs);
    start_prefetches(policy, clock, static_cast<int>(i), points);
  }
  return points;
}

TEST(PlannedPolicyTiming, AFetchWithNoVictimOfItsOwnWaitsPastATracedPeak) {
  // Chunk 3 is absent; the device has 1 byte left beside it (and room for
  // it without an eviction unless `fits` says not).
  const auto start_of_3 = [&](const std::vector<int>& sequence,
                              const std::vector<std::uint64_t>& non_model, std::uint64_t copy_ns,
                              bool fits = true) {
    PlannedPolicy policy(1);
    FakeClock clock;
    clock.copy = copy_ns;
    clock.room = 1;
    clock.fits = fits;
    return follow_with_non_model(policy, clock, sequence, non_model, {3}).started_after.at(3);
  };
  // Used at 6 ms, its 5 ms copy must start at the step's start; activations
  // peak at 2 bytes at access 4. Chunks 0, 1 and 2 are all used before it.
  const std::vector<int> sequence = {0, 1, 2, 0, 1, 2, 3};
  const std::vector<std::uint64_t> peak = {0, 0, 0, 0, 2, 0, 0};
  EXPECT_EQ(start_of_3(sequence, peak, 5 * kMs), 4) << "held until the peak is behind it";
  EXPECT_EQ(start_of_3(sequence, {0, 0, 0, 0, 0, 0, 0}, 5 * kMs), -1) << "no peak";
  EXPECT_EQ(start_of_3(sequence, {0, 0, 0, 0, 2, 0, 2}, 5 * kMs), 4)
      << "a rise just before its access as high as the peak does not release it early: a "
         "spill there would take the chunk in flight";
  EXPECT_EQ(start_of_3(sequence, {0, 0, 0, 0, 0, 0, 2}, 5 * kMs), 5)
      << "a rise just before its access (the op before ends) counts: held until chunk 2 has "
         "had its last use before it and can leave for that rise";
  EXPECT_EQ(start_of_3({0, 1, 2, 0, 1, 2, 3, 0}, {0, 0, 0, 0, 0, 0, 0, 2}, 5 * kMs), -1)
      << "its own op allocates once it holds the chunk: no reason to wait";
  // Used at 4 ms, a 1.5 ms copy must start after access 2; a peak at access 3.
  const std::vector<std::uint64_t> late_peak = {0, 0, 0, 2, 0};
  EXPECT_EQ(start_of_3({0, 1, 2, 0, 3}, late_peak, 1500 * 1000), 2)
      << "chunk 2, Belady's choice at its use, is not used before: it leaves for the peak";
  EXPECT_EQ(start_of_3({0, 1, 2, 2, 3}, late_peak, 1500 * 1000), 3)
      << "chunk 2 is used before it: no victim of its own";
  // Belady's choices at access 4: chunk 2, then chunk 1, used at access 3.
  EXPECT_EQ(start_of_3({0, 1, 2, 1, 3}, late_peak, 1500 * 1000), 2)
      << "room for it without an eviction: chunk 2 leaves for the peak";
  EXPECT_EQ(start_of_3({0, 1, 2, 1, 3}, late_peak, 1500 * 1000, /*fits=*/false), 3)
      << "chunk 2 leaves for the fetch itself, and chunk 1 is used before it: no victim for "
         "the peak";
}

// A device of `slots` chunk-sized slots shared by chunks and activations,
// driven the way the chunk manager drives the policy: a missing chunk is
// fetched on use; after each access (chunk in use) and its release, the
// policy's prefetches start, each evicting choose_victim_for_prefetch's
// chunk when the device is full; an activation that finds it full spills
// choose_victim's chunk (num_spills_for_allocation).
class SlotDevice final : public EvictionCandidates {
 public:
  SlotDevice(PlannedPolicy& policy, FakeClock& clock, std::size_t slots,
             bool tells_non_model = true)
      : policy_(policy), clock_(clock), slots_(slots), tells_non_model_(tells_non_model) {}
  bool evictable(ChunkId id) const override {
    return resident_.count(id) != 0 && (!in_use_ || *in_use_ != id);
  }
  void place(int id) {
    resident_.insert(chunk(id));
    policy_.on_resident(chunk(id));
  }
  void access(int id, std::uint64_t time) {
    clock_.now = time;
    policy_.note_time(time);
    // Note [Room a prefetch takes early]: an activation is a slot's bytes.
    if (tells_non_model_) policy_.note_non_model_high_water(high_water_);
    high_water_ = activations_;
    in_use_ = chunk(id);
    if (resident_.count(chunk(id)) == 0) {
      if (used() == slots_) evict(*policy_.choose_victim(*this));
      fetch(chunk(id));
    }
    policy_.on_access(chunk(id));
    prefetch();
    in_use_.reset();
    prefetch();
  }
  void allocate_activation() {
    if (used() == slots_) {
      const std::optional<ChunkId> victim = policy_.choose_victim(*this);
      ASSERT_TRUE(victim.has_value());
      evict(*victim);
      ++spills;
    }
    ++activations_;
    high_water_ = std::max(high_water_, activations_);
  }
  void free_activation() {
    --activations_;
    prefetch();
  }
  void end_step(std::uint64_t time) {
    clock_.now = time;
    policy_.note_time(time);
    policy_.on_step_end();
    prefetch();
  }
  int fetches = 0;
  int spills = 0;

 private:
  std::size_t used() const { return resident_.size() + activations_; }
  void evict(ChunkId victim) {
    resident_.erase(victim);
    policy_.on_evicted(victim);
  }
  void fetch(ChunkId id) {
    resident_.insert(id);
    policy_.on_resident(id);
    ++fetches;
    if (clock_.copy) clock_.free_at = std::max(clock_.free_at, clock_.now) + *clock_.copy;
  }
  void prefetch() {
    // The room an incoming chunk leaves (the chunk manager's room_bytes).
    clock_.room = used() < slots_ ? slots_ - used() - 1 : 0;
    clock_.fits = used() < slots_;
    clock_.non_model = activations_;
    while (const std::optional<PlannedFetch> next = policy_.timed_prefetch(clock_)) {
      if (used() == slots_) {
        const std::optional<ChunkId> victim =
            policy_.choose_victim_for_prefetch(*this, next->chunk);
        if (!victim) return;
        evict(*victim);
      }
      fetch(next->chunk);
      clock_.room = used() < slots_ ? slots_ - used() - 1 : 0;
      clock_.fits = used() < slots_;
    }
  }

  PlannedPolicy& policy_;
  FakeClock& clock_;
  std::size_t slots_;
  std::set<ChunkId> resident_;
  std::optional<ChunkId> in_use_;
  std::size_t activations_ = 0;
  std::size_t high_water_ = 0;  // activations since the access before
  bool tells_non_model_;
};

struct SpillRun {
  int fetches = 0;
  int spills = 0;
};

// Six steps of `step` (chunk ids, one 1 ms op each) on the device, with
// `per_rise` activations alive over each op in `rises`; the counts after
// the traced step.
SpillRun run_steps(SlotDevice& device, const std::vector<int>& step,
                   const std::set<std::size_t>& rises, int per_rise) {
  SpillRun counted;
  std::uint64_t start = 0;
  for (int index = 0; index < 6; ++index) {
    if (index == 1) counted = {device.fetches, device.spills};
    for (std::size_t op = 0; op < step.size(); ++op) {
      const bool rises_here = rises.contains(op);
      for (int i = 0; rises_here && i < per_rise; ++i) device.allocate_activation();
      device.access(step[op], start + op * kMs);
      for (int i = 0; rises_here && i < per_rise; ++i) device.free_activation();
    }
    start += step.size() * kMs;
    device.end_step(start);
  }
  return {device.fetches - counted.fetches, device.spills - counted.spills};
}

// Chunks 0..4 used one per 1 ms op on 5 slots, an activation alive over op
// 1 and another over op 3. The first spills chunk 0 (next used in the next
// step). Fetched back as soon as the first activation is gone, it fills the
// slot the second one needs, which spills chunk 2 (fetched again later);
// fetched back when its use nears, after the second, it spills nothing.
SpillRun run_with_activations(std::optional<std::uint64_t> copy_ns) {
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = copy_ns;
  SlotDevice device(policy, clock, 5);
  for (int id = 0; id < 5; ++id) device.place(id);
  return run_steps(device, {0, 1, 2, 3, 4}, {1, 3}, 1);
}

TEST(PlannedPolicyTiming, AFetchThatWouldForceAnExtraSpillWaits) {
  const SpillRun untimed = run_with_activations(std::nullopt);
  const SpillRun timed = run_with_activations(500 * 1000);
  std::printf(
      "5 chunks on 5 slots, two activations: untimed %d fetches, %d spills; timed %d "
      "fetches, %d spills\n",
      untimed.fetches, untimed.spills, timed.fetches, timed.spills);
  // Five followed steps: one spill and one fetch each (chunk 0, for the first
  // activation) timed; untimed, chunk 2's spill and fetch besides.
  EXPECT_EQ(timed.spills, 5);
  EXPECT_EQ(timed.fetches, 5);
  EXPECT_EQ(untimed.spills, 10);
  EXPECT_EQ(untimed.fetches, 10);
}

// Chunks 0, 1 and 2 used twice, then chunk 3, one 1 ms op each, on 5 slots;
// two activations alive over the second op and again over the fifth. Each
// first rise spills chunk 3 (used last). Its copy (5 ms) must then start at
// once to land in time.
SpillRun run_with_rising_activations(bool tells_non_model) {
  PlannedPolicy policy(1);
  FakeClock clock;
  clock.copy = 5 * kMs;
  SlotDevice device(policy, clock, 5, tells_non_model);
  for (int id = 0; id < 4; ++id) device.place(id);
  return run_steps(device, {0, 1, 2, 0, 1, 2, 3}, {1, 4}, 2);
}

TEST(PlannedPolicyTiming, AFetchThatActivationsWouldSpillWaitsUntilTheirPeakIsBehindIt) {
  const SpillRun blind = run_with_rising_activations(false);
  const SpillRun told = run_with_rising_activations(true);
  std::printf(
      "chunk 3 under two rises of activations, 5 steps: without non-model bytes %d fetches, "
      "%d spills; with them %d fetches, %d spills\n",
      blind.fetches, blind.spills, told.fetches, told.spills);
  // Blind, chunk 3 comes back as soon as the first rise is gone, and takes
  // the room the second rise needs: that spills chunk 0 (the farthest then),
  // fetched again after it. Told, chunk 3 waits until the second rise is
  // behind it: one spill (chunk 3, by the first rise) and one fetch a step.
  EXPECT_EQ(blind.fetches, 10);
  EXPECT_EQ(blind.spills, 10);
  EXPECT_EQ(told.fetches, 5);
  EXPECT_EQ(told.spills, 5);
}

// In the chunk manager on the simulated device (sim_bandwidth): copies too
// slow to hide behind no compute stall every access; the stats say so, for
// the step and in total, expected and measured.
TEST(PlannedPolicyTiming, TheChunkManagerReportsExpectedAndActualStallsPerStep) {
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  options.bandwidth_bytes_per_s = 2e9;  // 2 MiB in about 1 ms
  options.timed_prefetch = true;
  // Planned from the second step, whose accesses are the ones that follow
  // (the first writes the bytes, and its ops take that long).
  options.make_policy = [] { return std::make_unique<PlannedPolicy>(2); };
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  std::vector<TensorId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(register_ok(chunks, model, options.chunk_size, "l"));
  std::vector<std::uint8_t> bytes(options.chunk_size, 7);
  for (TensorId id : ids) write_on_device(chunks, id, bytes);
  chunks.end_step();
  for (int step = 0; step < 4; ++step) {
    for (TensorId id : ids) {
      void* data = nullptr;
      ASSERT_EQ(chunks.acquire(id, Stream{}, &data, AccessMode::read, WaitMode::host), Status::ok)
          << ChunkManager::last_error();
      ASSERT_EQ(chunks.release(id, Stream{}), Status::ok);
    }
    chunks.end_step();
  }
  Stats stats;
  chunks.stats().add_to(&stats);

  EXPECT_GT(stats.stall_last_actual, 0) << "every step fetches two chunks it cannot hide";
  EXPECT_GT(stats.stall_last_expected, 0) << "the copy model sees them coming late";
  EXPECT_GT(stats.stall_ns_expected, stats.stall_last_expected) << "totals span every step";
  EXPECT_EQ(stats.stall_ns_actual, stats.stall_ns);
  EXPECT_GE(stats.stall_ns_actual, stats.stall_last_actual);
  EXPECT_EQ(chunks.client_stats(model).stall_expected_ns, stats.stall_ns_expected);
  std::printf(
      "5 chunks under 3, no compute, 2 GB/s: last step stall expected %.2f ms, "
      "measured %.2f ms\n",
      stats.stall_last_expected / 1e6, stats.stall_last_actual / 1e6);
}

}  // namespace
}  // namespace spillway::testing
