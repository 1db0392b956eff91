// Stats equal an independent tally: the test counts what it allocated and
// freed itself, and a CountingDevice counts what reached the device.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

struct StatTally {
  std::int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(std::int64_t n) {
    current += n;
    allocated += n;
    peak = std::max(peak, current);
  }
  void remove(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void reset_peak() { peak = current; }
};

void expect_equal(const StatArray& stat, const StatTally& tally, const char* name) {
  EXPECT_EQ(stat.current, tally.current) << name;
  EXPECT_EQ(stat.peak, tally.peak) << name;
  EXPECT_EQ(stat.allocated, tally.allocated) << name;
  EXPECT_EQ(stat.freed, tally.freed) << name;
}

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

TEST(CachingAllocatorStats, EqualAnIndependentTallyOverARandomSequence) {
  SimDevice sim(sim_options(1024 * MiB));
  CountingDevice device(sim);
  RecordingTraceSink trace;
  CachingAllocator allocator(device, allocator_options(96 * MiB, 8 * MiB), &trace);
  Stream streams[2];
  for (Stream& stream : streams) ASSERT_EQ(sim.create_stream(&stream), Status::ok);

  std::mt19937_64 rng(1234);
  struct Live {
    void* ptr;
    std::int64_t bytes;
  };
  std::vector<Live> live;
  StatTally allocations, allocated_bytes, segments, reserved_bytes;
  std::int64_t ooms = 0;
  std::int64_t peak_segments_since_reset = 0;

  for (int step = 1; step <= 6000; ++step) {
    if (live.empty() || rng() % 100 < 55) {
      // Small requests of any size; large and oversize ones in whole 2 MiB
      // units, so every split leaves a remainder worth splitting off and a
      // block's size is exactly the rounded request.
      std::size_t bytes;
      const auto kind = rng() % 10;
      if (kind < 7) {
        bytes = 1 + rng() % (1 * MiB);
      } else if (kind < 9) {
        bytes = (1 + rng() % 4) * 2 * MiB;
      } else {
        bytes = (5 + rng() % 8) * 2 * MiB;
      }
      void* ptr = nullptr;
      const Status status = allocator.allocate(&ptr, bytes, streams[rng() % 2]);
      if (status == Status::ok) {
        const auto rounded = static_cast<std::int64_t>(round_up(bytes, 512));
        live.push_back({ptr, rounded});
        allocations.add(1);
        allocated_bytes.add(rounded);
      } else {
        ASSERT_EQ(status, Status::out_of_memory);
        ++ooms;
      }
    } else {
      const std::size_t victim = rng() % live.size();
      ASSERT_EQ(allocator.deallocate(live[victim].ptr), Status::ok);
      allocations.remove(1);
      allocated_bytes.remove(live[victim].bytes);
      live[victim] = live.back();
      live.pop_back();
    }
    if (step % 700 == 0) allocator.empty_cache();

    const CountingDevice::Tally device_tally = device.tally();
    segments.current = device_tally.mallocs - device_tally.frees;
    segments.allocated = device_tally.mallocs;
    segments.freed = device_tally.frees;
    peak_segments_since_reset = std::max(peak_segments_since_reset, segments.current);
    segments.peak = peak_segments_since_reset;
    reserved_bytes = {device_tally.current_bytes, device_tally.peak_bytes,
                      device_tally.allocated_bytes, device_tally.freed_bytes};

    const Stats stats = allocator.stats();
    SCOPED_TRACE(step);
    expect_equal(stats.allocation, allocations, "allocation");
    expect_equal(stats.allocated_bytes, allocated_bytes, "allocated_bytes");
    expect_equal(stats.active_bytes, allocated_bytes, "active_bytes");
    expect_equal(stats.segment, segments, "segment");
    expect_equal(stats.reserved_bytes, reserved_bytes, "reserved_bytes");
    ASSERT_EQ(stats.num_device_alloc, device_tally.mallocs);
    ASSERT_EQ(stats.num_device_free, device_tally.frees);
    ASSERT_EQ(stats.num_ooms, ooms);
    ASSERT_GE(stats.num_alloc_retries, ooms);
    if (::testing::Test::HasFailure()) break;

    if (step % 1000 == 0) {
      allocator.reset_peak_stats();
      allocations.reset_peak();
      allocated_bytes.reset_peak();
      device.reset_peak();
      peak_segments_since_reset = segments.current;
      const Stats reset = allocator.stats();
      EXPECT_EQ(reset.allocated_bytes.peak, reset.allocated_bytes.current);
      EXPECT_EQ(reset.reserved_bytes.peak, reset.reserved_bytes.current);
    }
  }
  EXPECT_GT(ooms, 0) << "the budget was never reached";

  // The trace tells the same story.
  std::int64_t alloc_events = 0, free_events = 0, segment_allocs = 0, segment_frees = 0,
               oom_events = 0, segment_bytes = 0;
  for (const TraceEvent& event : trace.events()) {
    switch (event.kind) {
      case TraceEventKind::alloc:
        ++alloc_events;
        break;
      case TraceEventKind::free:
        ++free_events;
        break;
      case TraceEventKind::segment_alloc:
        ++segment_allocs;
        segment_bytes += static_cast<std::int64_t>(event.size);
        break;
      case TraceEventKind::segment_free:
        ++segment_frees;
        break;
      case TraceEventKind::oom:
        ++oom_events;
        break;
    }
  }
  const Stats stats = allocator.stats();
  EXPECT_EQ(alloc_events, stats.allocation.allocated);
  EXPECT_EQ(free_events, stats.allocation.freed);
  EXPECT_EQ(segment_allocs, stats.num_device_alloc);
  EXPECT_EQ(segment_frees, stats.num_device_free);
  EXPECT_EQ(segment_bytes, stats.reserved_bytes.allocated);
  EXPECT_EQ(oom_events, stats.num_ooms);

  for (const Live& block : live) ASSERT_EQ(allocator.deallocate(block.ptr), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(CachingAllocatorStats, ActiveBytesIncludeBlocksAwaitingOtherStreams) {
  SimDevice device(sim_options(64 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB));
  Stream a, b;
  ASSERT_EQ(device.create_stream(&a), Status::ok);
  ASSERT_EQ(device.create_stream(&b), Status::ok);
  StreamGate gate;
  void* p = allocate_ok(allocator, 1000, a);
  ASSERT_EQ(allocator.record_stream(p, b), Status::ok);
  gate.hold(device, b);
  ASSERT_EQ(allocator.deallocate(p), Status::ok);
  Stats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.allocated_bytes.freed, 1024);
  EXPECT_EQ(stats.active_bytes.current, 1024);
  EXPECT_EQ(stats.allocation.current, 0);
  gate.open();
  ASSERT_EQ(device.synchronize_stream(b), Status::ok);
  void* q = allocate_ok(allocator, 1000, a);  // collects the completed event
  stats = allocator.stats();
  EXPECT_EQ(stats.active_bytes.current, 1024);  // q only
  EXPECT_EQ(stats.active_bytes.freed, 1024);
  EXPECT_EQ(stats.active_bytes.allocated, 2048);
  ASSERT_EQ(allocator.deallocate(q), Status::ok);
}

TEST(CachingAllocatorStats, JsonUsesPyTorchKeyNames) {
  SimDevice device(sim_options(64 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB));
  void* p = allocate_ok(allocator, 4096);
  const std::string json = allocator.stats().to_json();
  EXPECT_NE(json.find("\"allocated_bytes.all.current\":4096"), std::string::npos) << json;
  EXPECT_NE(json.find("\"reserved_bytes.all.current\":2097152"), std::string::npos) << json;
  EXPECT_NE(json.find("\"num_device_alloc\":1"), std::string::npos) << json;
  ASSERT_EQ(allocator.deallocate(p), Status::ok);
}

}  // namespace
}  // namespace spillway::testing
