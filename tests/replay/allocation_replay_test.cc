// Replay through the caching allocator on SimDevice: figures, inconsistent
// traces, budgets, streams, and the shipped GPT-2 traces.
#include "tools/replay/allocation_replay.h"

#include <gtest/gtest.h>

#include <string>

namespace spillway {
namespace {

AllocationTrace csv(const char* text) {
  auto result = parse_allocation_csv(text, "t.csv");
  EXPECT_TRUE(result.ok()) << result.error;
  return result.trace;
}

TEST(replay_Replay, CountsAndPeaks) {
  const AllocationTrace trace =
      csv("alloc,1,1000\n"
          "alloc,2,3000000\n"
          "free,1\n"
          "alloc,3,500\n"
          "free,2\n"
          "free,3\n");
  ReplayResult result;
  std::string error;
  ASSERT_TRUE(replay_allocations(trace, {}, &result, &error)) << error;
  EXPECT_EQ(result.allocs, 3u);
  EXPECT_EQ(result.frees, 3u);
  EXPECT_EQ(result.unmatched_frees, 0u);
  EXPECT_EQ(result.peak_requested_bytes, 3001000u);
  EXPECT_GE(result.peak_allocated_bytes(), 3001000);
  EXPECT_GE(result.peak_reserved_bytes(), result.peak_allocated_bytes());
  EXPECT_GE(result.fragmentation(), 1.0);
  EXPECT_EQ(result.stats.num_ooms, 0);
  EXPECT_GT(result.stats.num_device_alloc, 0);
  EXPECT_EQ(result.stats.allocated_bytes.current, 0);
}

// An empty_cache event gives the cached segment back before the larger
// request, so the two segments are never reserved at once.
TEST(replay_Replay, EmptyCacheReturnsCachedSegments) {
  const char* kept = "alloc,1,20000000\nfree,1\nalloc,2,60000000\nfree,2\n";
  const char* emptied = "alloc,1,20000000\nfree,1\nempty_cache\nalloc,2,60000000\nfree,2\n";
  ReplayResult with_cache, without_cache;
  std::string error;
  ASSERT_TRUE(replay_allocations(csv(kept), {}, &with_cache, &error)) << error;
  ASSERT_TRUE(replay_allocations(csv(emptied), {}, &without_cache, &error)) << error;
  EXPECT_EQ(with_cache.cache_releases, 0u);
  EXPECT_EQ(without_cache.cache_releases, 1u);
  EXPECT_EQ(without_cache.allocs, 2u);
  EXPECT_EQ(without_cache.frees, 2u);
  EXPECT_GE(with_cache.peak_reserved_bytes(), 80'000'000);
  EXPECT_LT(without_cache.peak_reserved_bytes(), 80'000'000);
  EXPECT_GE(without_cache.peak_reserved_bytes(), 60'000'000);
}

TEST(replay_Replay, AllocOfALiveAddressIsAnErrorNamingBothLines) {
  const AllocationTrace trace = csv("alloc,1,100\nalloc,2,100\nalloc,1,100\n");
  ReplayResult result;
  std::string error;
  EXPECT_FALSE(replay_allocations(trace, {}, &result, &error));
  EXPECT_NE(error.find("line 3: alloc of address 1 which is still live (allocated at line 1)"),
            std::string::npos)
      << error;
}

TEST(replay_Replay, ATraceOfMoreStreamsThanTheBoundIsAnError) {
  // One simulated stream (and thread) per stream of the trace: 256 at most.
  std::string text;
  for (int stream = 1; stream <= 257; ++stream)
    text += "alloc," + std::to_string(stream) + ",512," + std::to_string(stream) + "\n";
  ReplayResult result;
  std::string error;
  EXPECT_FALSE(replay_allocations(csv(text.c_str()), {}, &result, &error));
  EXPECT_NE(error.find("the trace uses 257 streams besides the default one; spillway-replay "
                       "replays at most 256"),
            std::string::npos)
      << error;
}

TEST(replay_Replay, UnmatchedFreesAreCountedAndSkipped) {
  const AllocationTrace trace = csv("free,9\nalloc,1,100\nfree,1\n");
  ReplayResult result;
  std::string error;
  ASSERT_TRUE(replay_allocations(trace, {}, &result, &error)) << error;
  EXPECT_EQ(result.unmatched_frees, 1u);
}

TEST(replay_Replay, BudgetMakesAllocationsFailAndTheirFreesAreSkipped) {
  const AllocationTrace trace =
      csv("alloc,1,30000000\n"
          "alloc,2,30000000\n"  // over a 40 MB budget
          "free,2\n"
          "free,1\n"
          "alloc,3,30000000\n"  // fits again
          "free,3\n");
  ReplayOptions options;
  options.budget_bytes = 40'000'000;
  options.chunk_size = 8 << 20;
  ReplayResult result;
  std::string error;
  ASSERT_TRUE(replay_allocations(trace, options, &result, &error)) << error;
  EXPECT_EQ(result.failed_allocs, 1u);
  EXPECT_EQ(result.stats.num_ooms, 1);
  EXPECT_EQ(result.unmatched_frees, 0u);
  EXPECT_LE(result.peak_reserved_bytes(), 40'000'000);
}

TEST(replay_Replay, EventsOnOtherStreamsReplayOnTheirOwnStreams) {
  const AllocationTrace trace =
      csv("alloc,1,1000,0\n"
          "alloc,2,1000,0x77\n"
          "free,1,1000,0\n"
          "free,2,1000,0x77\n"
          "alloc,3,1000,0x77\n"
          "free,3,1000,0x77\n");
  ReplayResult result;
  std::string error;
  ASSERT_TRUE(replay_allocations(trace, {}, &result, &error)) << error;
  // Blocks belong to their stream: two streams need two small slabs.
  EXPECT_EQ(result.stats.num_device_alloc, 2);
}

class replay_ShippedTrace : public ::testing::TestWithParam<const char*> {};

TEST_P(replay_ShippedTrace, ReplaysConsistently) {
  const auto loaded = load_allocation_trace(std::string(SPILLWAY_TEST_DATA_DIR "/") + GetParam());
  ASSERT_TRUE(loaded.ok()) << loaded.error;
  ReplayResult result;
  std::string error;
  ASSERT_TRUE(replay_allocations(loaded.trace, {}, &result, &error)) << error;
  EXPECT_EQ(result.unmatched_frees, 0u);
  EXPECT_EQ(result.failed_allocs, 0u);
  EXPECT_EQ(result.allocs + result.frees, loaded.trace.events.size());
  EXPECT_GT(result.peak_requested_bytes, std::uint64_t{1} << 30);
  EXPECT_GE(static_cast<std::uint64_t>(result.peak_allocated_bytes()), result.peak_requested_bytes);
  EXPECT_GE(result.peak_reserved_bytes(), result.peak_allocated_bytes());
}

INSTANTIATE_TEST_SUITE_P(Traces, replay_ShippedTrace,
                         ::testing::Values("gpt2_small_amp_fp16.csv", "gpt2_medium_bf16.csv",
                                           "gpt2_longctx_amp_fp16.csv", "tiny_v1.trace"));

}  // namespace
}  // namespace spillway
