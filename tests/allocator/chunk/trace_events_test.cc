// The chunk manager's trace events (format versions 2 and 3): every move,
// stall, device acquire and release and step boundary is recorded with its
// client, chunk and bytes, in the order of effects, and the events add up to
// the manager's own statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "chunk_test_support.h"
#include "tests/support/recording_trace_sink.h"
#include "tracer/trace_event.h"

namespace spillway::testing {
namespace {

std::uint64_t total_size(const std::vector<TraceEvent>& events) {
  std::uint64_t sum = 0;
  for (const TraceEvent& e : events) sum += e.size;
  return sum;
}

TEST(ChunkTraceEvents, MovesAddUpToTheStatisticsAndNameTheirClient) {
  RecordingTraceSink log;
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  options.trace = &log;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId actor = chunks.add_client("actor");
  const ClientId critic = chunks.add_client("critic");
  std::vector<TensorId> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(register_ok(chunks, actor, 1536 * KiB, "a" + std::to_string(i)));
    ids.push_back(register_ok(chunks, critic, 1024 * KiB, "c" + std::to_string(i)));
  }
  for (int round = 0; round < 2; ++round)
    for (std::size_t i = 0; i < ids.size(); ++i)
      write_on_device(chunks, ids[i], random_bytes(i % 2 ? 1024 * KiB : 1536 * KiB, round + i));
  chunks.synchronize();

  const ChunkStats stats = chunks.stats();
  const auto fetches = log.of_kind(TraceEventKind::chunk_fetch);
  const auto writebacks = log.of_kind(TraceEventKind::chunk_writeback);
  const auto drops = log.of_kind(TraceEventKind::chunk_drop);
  EXPECT_EQ(static_cast<std::int64_t>(fetches.size()), stats.fetches);
  EXPECT_EQ(static_cast<std::int64_t>(total_size(fetches)), stats.bytes_moved_h2d);
  EXPECT_EQ(static_cast<std::int64_t>(writebacks.size()), stats.writebacks);
  EXPECT_EQ(static_cast<std::int64_t>(total_size(writebacks)), stats.bytes_moved_d2h);
  EXPECT_EQ(std::count_if(drops.begin(), drops.end(),
                          [](const TraceEvent& e) { return e.detail == kTraceDetailEviction; }),
            stats.evictions);
  ASSERT_GT(stats.evictions, 0) << "the budget must force evictions for this test to mean much";

  for (const TraceEvent& e : fetches) {
    const auto info = chunks.chunk_info(static_cast<ChunkId>(e.address));
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(e.client, static_cast<std::uint32_t>(info->client));
    // Its device copy: a whole slab (Note [A device copy is a whole slab]),
    // though the chunk's capacity is what its tensors hold.
    EXPECT_EQ(e.stream, chunks.options().chunk_size);
    EXPECT_EQ(info->capacity_bytes, (info->used_bytes + 511) / 512 * 512);
    EXPECT_EQ(e.detail, 0);  // none was a prefetch
  }
  const ChunkStats actor_stats = chunks.client_stats(actor);
  std::int64_t actor_h2d = 0;
  for (const TraceEvent& e : fetches)
    if (e.client == static_cast<std::uint32_t>(actor))
      actor_h2d += static_cast<std::int64_t>(e.size);
  EXPECT_EQ(actor_h2d, actor_stats.bytes_moved_h2d);
}

// Replaying the events gives the resident bytes the manager reports, and a
// chunk's device copy is allocated before its fetch is recorded.
TEST(ChunkTraceEvents, ReplayedResidencyMatchesAndFollowsTheAllocation) {
  RecordingTraceSink log;
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  options.trace = &log;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  std::vector<TensorId> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(register_ok(chunks, model, 1536 * KiB, "w"));
  for (TensorId id : ids) write_on_device(chunks, id, random_bytes(1536 * KiB, 7));
  chunks.synchronize();

  std::int64_t resident = 0;
  std::uint64_t live_allocations = 0;
  for (const TraceEvent& e : log.events()) {
    switch (e.kind) {
      case TraceEventKind::alloc:
        ++live_allocations;
        break;
      case TraceEventKind::free:
        --live_allocations;
        break;
      case TraceEventKind::chunk_fetch:
        EXPECT_GT(live_allocations, 0u) << "a fetch before any device copy was allocated";
        resident += static_cast<std::int64_t>(e.stream);
        break;
      case TraceEventKind::chunk_drop:
        EXPECT_EQ(e.size, e.stream);
        resident -= static_cast<std::int64_t>(e.size);
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(resident, chunks.stats().chunk_bytes_device);
  EXPECT_EQ(resident, static_cast<std::int64_t>(3 * options.chunk_size));
}

TEST(ChunkTraceEvents, PrefetchesAndStallsAreMarked) {
  RecordingTraceSink log;
  ChunkRigOptions options;
  options.trace = &log;
  options.bandwidth_bytes_per_s = 1e9;  // slow copies, so acquiring right after waits
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  const TensorId w = register_ok(chunks, model, 1536 * KiB, "w");
  write_on_device(chunks, w, random_bytes(1536 * KiB, 3));
  ASSERT_EQ(chunks.evict(chunks.tensor_info(w)->chunk), Status::ok);
  ASSERT_EQ(chunks.prefetch(w), Status::ok);
  void* data = nullptr;
  ASSERT_EQ(chunks.acquire(w, {}, &data, AccessMode::read, WaitMode::host), Status::ok);
  ASSERT_EQ(chunks.release(w, {}), Status::ok);
  chunks.synchronize();

  const auto fetches = log.of_kind(TraceEventKind::chunk_fetch);
  ASSERT_EQ(fetches.size(), 2u);
  EXPECT_EQ(fetches[0].detail, 0);
  EXPECT_EQ(fetches[1].detail, kTraceDetailPrefetch);
  const auto stalls = log.of_kind(TraceEventKind::stall);
  EXPECT_EQ(static_cast<std::int64_t>(total_size(stalls)), chunks.stats().stall_ns);
  ASSERT_FALSE(stalls.empty());
  EXPECT_EQ(stalls.back().address, fetches[1].address);
  const auto drops = log.of_kind(TraceEventKind::chunk_drop);
  ASSERT_EQ(drops.size(), 1u);
  EXPECT_EQ(drops[0].detail, kTraceDetailEviction);  // evict() is an eviction too
}

// Version 3: every device acquire is a chunk_access after the chunk's fetch,
// every release a chunk_release; nested acquires each record one.
TEST(ChunkTraceEvents, AccessesAndReleasesBracketTheUsesAroundFetches) {
  RecordingTraceSink log;
  ChunkRigOptions options;
  options.chunk_budget = options.chunk_size;  // one resident chunk: b evicts a
  options.trace = &log;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  const TensorId a = register_ok(chunks, model, 1536 * KiB, "a");
  const TensorId b = register_ok(chunks, model, 1536 * KiB, "b");
  const auto chunk_a = static_cast<std::uint64_t>(chunks.tensor_info(a)->chunk);
  const auto chunk_b = static_cast<std::uint64_t>(chunks.tensor_info(b)->chunk);
  ASSERT_NE(chunk_a, chunk_b);

  void* data = nullptr;
  ASSERT_EQ(chunks.acquire(a, {}, &data, AccessMode::read_write, WaitMode::host), Status::ok);
  ASSERT_EQ(chunks.release(a, {}), Status::ok);
  ASSERT_EQ(chunks.acquire(b, {}, &data, AccessMode::read, WaitMode::host), Status::ok);
  ASSERT_EQ(chunks.acquire(b, {}, &data, AccessMode::read, WaitMode::host), Status::ok);
  ASSERT_EQ(chunks.release(b, {}), Status::ok);
  ASSERT_EQ(chunks.release(b, {}), Status::ok);
  // Failed calls record nothing.
  EXPECT_NE(chunks.release(b, {}), Status::ok);
  EXPECT_NE(chunks.acquire(TensorId{999}, {}, &data), Status::ok);
  chunks.synchronize();

  struct Step {
    TraceEventKind kind;
    std::uint64_t chunk;
    std::uint16_t detail;
  };
  const std::vector<Step> want = {
      {TraceEventKind::chunk_fetch, chunk_a, 0},
      {TraceEventKind::chunk_access, chunk_a, kTraceDetailReadWrite},
      {TraceEventKind::chunk_release, chunk_a, 0},
      {TraceEventKind::chunk_writeback, chunk_a, 0},  // dirty, evicted for b
      {TraceEventKind::chunk_drop, chunk_a, kTraceDetailEviction},
      {TraceEventKind::chunk_fetch, chunk_b, 0},
      {TraceEventKind::chunk_access, chunk_b, kTraceDetailRead},
      {TraceEventKind::chunk_access, chunk_b, kTraceDetailRead},
      {TraceEventKind::chunk_release, chunk_b, 0},
      {TraceEventKind::chunk_release, chunk_b, 0},
  };
  std::vector<TraceEvent> got;
  for (const TraceEvent& e : log.events())
    if (e.kind >= TraceEventKind::chunk_fetch && e.kind != TraceEventKind::stall) got.push_back(e);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kind, want[i].kind) << i;
    EXPECT_EQ(got[i].address, want[i].chunk) << i;
    EXPECT_EQ(got[i].detail, want[i].detail) << i;
    EXPECT_EQ(got[i].client, static_cast<std::uint32_t>(model)) << i;
    EXPECT_EQ(got[i].stream, options.chunk_size) << i;  // its device copy: a whole slab
    if (got[i].kind == TraceEventKind::chunk_access || got[i].kind == TraceEventKind::chunk_release)
      EXPECT_EQ(got[i].size, static_cast<std::uint64_t>(got[i].address == chunk_a ? a : b)) << i;
    if (i > 0) EXPECT_LE(got[i - 1].time_ns, got[i].time_ns) << i;
  }
}

TEST(ChunkTraceEvents, StepsAreNumberedFromOne) {
  RecordingTraceSink log;
  ChunkRigOptions options;
  options.trace = &log;
  ChunkRig rig(options);
  EXPECT_EQ(rig.chunks->end_step(), 1u);
  EXPECT_EQ(rig.chunks->end_step(), 2u);
  EXPECT_EQ(rig.chunks->steps_ended(), 2u);
  const auto steps = log.of_kind(TraceEventKind::step);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].address, 1u);
  EXPECT_EQ(steps[1].address, 2u);
  EXPECT_LE(steps[0].time_ns, steps[1].time_ns);
}

}  // namespace
}  // namespace spillway::testing
