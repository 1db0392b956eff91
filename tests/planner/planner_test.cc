// Planner: Belady's eviction count against an exhaustive search, every plan
// within every moment's budget, and the error for an op that cannot fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <map>
#include <random>
#include <utility>

#include "tracer/planner/plan_check.h"
#include "tracer/planner/planner.h"

namespace spillway::plan {
namespace {

constexpr std::uint64_t kChunk = 1 << 20;

StepTrace single_chunk_trace(const std::vector<PlanChunk>& sequence) {
  StepTrace trace;
  for (PlanChunk chunk : sequence) {
    trace.ops.push_back({"op" + std::to_string(trace.ops.size()), 1000, 0, {{chunk, false}}});
  }
  return trace;
}

// The fewest evictions serving `ops` (sets of chunks, as bitmasks) from an
// empty device of `capacity` chunks, trying every choice of victims.
class BruteForce {
 public:
  BruteForce(std::vector<unsigned> ops, int capacity) : ops_(std::move(ops)), capacity_(capacity) {}

  int min_evictions() { return solve(0, 0); }

 private:
  int solve(std::size_t position, unsigned resident) {
    if (position == ops_.size()) return 0;
    const auto key = std::make_pair(position, resident);
    if (auto found = memo_.find(key); found != memo_.end()) return found->second;
    const unsigned needed = ops_[position];
    const unsigned after_fetch = resident | needed;
    const int excess = std::popcount(after_fetch) - capacity_;
    int best = 1 << 20;
    if (excess <= 0) {
      best = solve(position + 1, after_fetch);
    } else {
      // Every subset of the evictable chunks with exactly `excess` members.
      const unsigned evictable = resident & ~needed;
      for (unsigned victims = evictable;; victims = (victims - 1) & evictable) {
        if (std::popcount(victims) == excess) {
          best = std::min(best, excess + solve(position + 1, after_fetch & ~victims));
        }
        if (victims == 0) break;
      }
    }
    memo_[key] = best;
    return best;
  }

  std::vector<unsigned> ops_;
  int capacity_;
  std::map<std::pair<std::size_t, unsigned>, int> memo_;
};

struct RandomCase {
  StepTrace trace;
  std::vector<unsigned> masks;
  int capacity = 0;
};

RandomCase random_case(std::mt19937& rng, int max_chunks_per_op) {
  RandomCase c;
  const int chunks = std::uniform_int_distribution<int>(4, 6)(rng);
  c.capacity = std::uniform_int_distribution<int>(2, 3)(rng);
  const int length = std::uniform_int_distribution<int>(1, 12)(rng);
  std::uniform_int_distribution<int> pick(0, chunks - 1);
  std::uniform_int_distribution<int> width(1, std::min(max_chunks_per_op, c.capacity));
  for (int i = 0; i < length; ++i) {
    TracedOp op{"op" + std::to_string(i), 1000, 0, {}};
    unsigned mask = 0;
    const int w = width(rng);
    while (std::popcount(mask) < w) mask |= 1u << pick(rng);
    for (int chunk = 0; chunk < chunks; ++chunk) {
      if (mask & (1u << chunk))
        op.chunks.push_back({static_cast<PlanChunk>(chunk), rng() % 3 == 0});
    }
    c.trace.ops.push_back(op);
    c.masks.push_back(mask);
  }
  return c;
}

// 500 random small cases: Belady's eviction count equals the exhaustive
// search's, and every plan replays within the budget.
void expect_belady_matches_brute_force(unsigned seed, int max_chunks_per_op) {
  std::mt19937 rng(seed);
  for (int round = 0; round < 500; ++round) {
    const RandomCase c = random_case(rng, max_chunks_per_op);
    const CostModel model{c.capacity * kChunk, kChunk};
    const Plan plan = plan_step(c.trace, model, {}, {.cyclic = false, .prefetch_reserve = 0});
    ASSERT_EQ(static_cast<int>(plan.evictions), BruteForce(c.masks, c.capacity).min_evictions())
        << "round " << round;
    ASSERT_EQ(check_plan(c.trace, model, plan), std::nullopt) << "round " << round;
  }
}

TEST(Planner, BeladyEvictionsMatchBruteForceOnSingleChunkOps) {
  expect_belady_matches_brute_force(1234, 1);
}

TEST(Planner, BeladyEvictionsMatchBruteForceOnMultiChunkOps) {
  expect_belady_matches_brute_force(99, 2);
}

TEST(Planner, EveryPlanStaysWithinEachMomentsBudget) {
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    RandomCase c = random_case(rng, 2);
    // Non-model bytes that vary per moment leave 2..4 chunks of a 5-chunk budget.
    for (TracedOp& op : c.trace.ops) {
      const std::uint64_t spare = 4 - op.chunks.size();
      op.non_model_bytes = std::uniform_int_distribution<std::uint64_t>(0, spare)(rng) * kChunk / 2;
      op.non_model_bytes = std::min<std::uint64_t>(op.non_model_bytes, kChunk);
    }
    const CostModel model{5 * kChunk, kChunk};
    const Plan step = plan_step(c.trace, model, {});
    ASSERT_EQ(check_plan(c.trace, model, step), std::nullopt) << "round " << round;
    const Plan steady = plan_steady(c.trace, model);
    ASSERT_EQ(check_plan(c.trace, model, steady), std::nullopt) << "round " << round;
    const Plan demand = plan_step(c.trace, model, {}, {.prefetch = false});
    const Plan pure = plan_step(c.trace, model, {}, {.prefetch_reserve = 0});
    ASSERT_EQ(check_plan(c.trace, model, pure), std::nullopt) << "round " << round;
    ASSERT_EQ(demand.evictions, pure.evictions) << "prefetch changes timing, not residency";
    const Plan reserved = plan_step(c.trace, model, {}, {.prefetch_reserve = 1});
    ASSERT_EQ(check_plan(c.trace, model, reserved), std::nullopt) << "round " << round;
    ASSERT_GE(reserved.fetches, pure.fetches) << "round " << round;
    const Plan headroom = plan_steady(c.trace, model, {.headroom_reserve = 2});
    ASSERT_EQ(check_plan(c.trace, model, headroom), std::nullopt) << "round " << round;
  }
}

TEST(Planner, PrefetchIsIssuedBeforeTheOpThatNeedsIt) {
  // Forward over 8 chunks and back, with room for 4: each victim's last use
  // is long past when its room is needed, so every fetch can leave early.
  // (A pure cyclic sweep could not: Belady's victim there is the chunk the
  // previous op just used.)
  std::vector<PlanChunk> sweep;
  for (PlanChunk chunk = 0; chunk < 8; ++chunk) sweep.push_back(chunk);
  for (PlanChunk chunk = 8; chunk-- > 0;) sweep.push_back(chunk);
  const StepTrace trace = single_chunk_trace(sweep);
  const CostModel model{4 * kChunk, kChunk};
  const Plan plan = plan_steady(trace, model);
  ASSERT_EQ(check_plan(trace, model, plan), std::nullopt);
  std::size_t early = 0;
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    for (const PlannedFetch& fetch : plan.ops[i].fetch) {
      EXPECT_LE(i, fetch.use_op);
      early += i < fetch.use_op;
    }
  }
  EXPECT_GT(plan.fetches, 0u);
  EXPECT_EQ(early, plan.fetches);
}

TEST(Planner, CleanChunksAreEvictedBeforeDirtyOnesAtEqualDistance) {
  // Chunks 0 (written) and 1 (read) are never used again; chunk 2 needs room.
  StepTrace trace;
  trace.ops.push_back({"write0", 1, 0, {{0, true}}});
  trace.ops.push_back({"read1", 1, 0, {{1, false}}});
  trace.ops.push_back({"read2", 1, 0, {{2, false}}});
  const Plan plan =
      plan_step(trace, {2 * kChunk, kChunk}, {}, {.cyclic = false, .prefetch_reserve = 0});
  EXPECT_EQ(plan.d2h_bytes, 0u);
  EXPECT_TRUE(plan.end.contains(0));
  EXPECT_TRUE(plan.end.at(0));
}

// planner.h, dead bytes: a gradient chunk discarded after each step (fresh at
// its first use) is neither written back nor copied in, only zeroed.
StepTrace gradient_and_weight(bool fresh) {
  StepTrace trace;
  trace.ops.push_back({"backward", 1000, 0, {{0, true, fresh}}});
  trace.ops.push_back({"forward", 1000, 0, {{1, false}}});
  return trace;
}

TEST(Planner, DeadBytesAreNeitherWrittenBackNorCopied) {
  const CostModel model{kChunk, kChunk};  // one chunk at a time
  const StepTrace fresh = gradient_and_weight(true);
  const Plan plan = plan_steady(fresh, model);
  ASSERT_EQ(check_plan(fresh, model, plan), std::nullopt);
  EXPECT_EQ(plan.fetches, 2u);
  EXPECT_EQ(plan.h2d_bytes, kChunk) << "only the weight chunk is copied";
  EXPECT_EQ(plan.d2h_bytes, 0u) << "the gradient's bytes are dead when it leaves";
  ASSERT_EQ(plan.ops[0].fetch.size(), 1u);
  EXPECT_TRUE(plan.ops[0].fetch[0].zero_fill);
  EXPECT_EQ(plan.ops[0].fetch[0].use_op, 0u) << "a zero fill is issued at its use";

  const StepTrace kept = gradient_and_weight(false);
  const Plan copied = plan_steady(kept, model);
  EXPECT_EQ(copied.h2d_bytes, 2 * kChunk);
  EXPECT_EQ(copied.d2h_bytes, kChunk);
  // The check refuses a zero fill that would lose the gradient's bytes.
  EXPECT_NE(check_plan(kept, model, plan), std::nullopt);
}

TEST(Planner, BytesDieAfterTheLastUseBeforeAFreshOneAcrossTheStepsEnd) {
  StepTrace trace;
  trace.ops.push_back({"a", 1, 0, {{0, false, true}, {1, false}}});
  trace.ops.push_back({"b", 1, 0, {{0, true}}});
  trace.ops.push_back({"c", 1, 0, {{1, true}}});
  const std::vector<std::vector<PlanChunk>> dead = dead_after(trace);
  ASSERT_EQ(dead.size(), 3u);
  EXPECT_TRUE(dead[0].empty());
  EXPECT_EQ(dead[1], std::vector<PlanChunk>{0})
      << "chunk 0's next use is the next step's fresh one";
  EXPECT_TRUE(dead[2].empty());
}

TEST(Planner, TheSmallestBudgetIsTheLargestOpsChunksAndNonModelBytes) {
  StepTrace trace;
  trace.ops.push_back({"embed", 1, 4096, {{0, false}}});
  // Chunk 1 twice: counted once.
  trace.ops.push_back({"attention", 1, 512, {{1, false}, {2, false}, {1, true}}});
  CostModel model{0, kChunk};
  model.margin_bytes = 100;
  const std::uint64_t smallest = smallest_budget(trace, model);
  EXPECT_EQ(smallest, 2 * kChunk + 512 + 100);
  model.device_budget = smallest;
  EXPECT_NO_THROW(chunk_capacity(trace, model));
  model.device_budget = smallest - 1;
  EXPECT_THROW(chunk_capacity(trace, model), PlanError);
}

TEST(Planner, AnOpThatCannotFitNamesItselfAndTheBytes) {
  StepTrace trace;
  trace.ops.push_back({"embed", 1, 0, {{0, false}}});
  trace.ops.push_back({"attention", 1, 512, {{1, false}, {2, false}}});
  const CostModel model{2 * kChunk, kChunk};
  try {
    plan_steady(trace, model);
    FAIL() << "expected PlanError";
  } catch (const PlanError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("op #1 'attention'"), std::string::npos) << message;
    EXPECT_NE(message.find("needs 2097664 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("budget is 2097152"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace spillway::plan
