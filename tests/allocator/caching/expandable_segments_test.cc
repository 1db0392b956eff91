// Expandable segments and size classes (Notes [Expandable segments] and
// [Size classes] in caching_allocator.cc): mid-size blocks come from one
// segment per stream that grows in place by mapping pages and shrinks by
// unmapping a free tail; reserved bytes are the mapped bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

constexpr std::size_t kPage = SimDevice::kPageBytes;

CachingAllocatorOptions expandable_options(std::size_t budget_bytes,
                                           std::size_t chunk_bytes = 64 * MiB) {
  CachingAllocatorOptions options = allocator_options(budget_bytes, chunk_bytes);
  options.expandable_segments = true;
  return options;
}

std::int64_t reserved(const CachingAllocator& allocator) {
  return allocator.stats().reserved_bytes.current;
}

TEST(ExpandableSegments, AMidSizeBlockGrowsTheSegmentInPlace) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  void* first = allocate_ok(allocator, 3 * MiB);
  EXPECT_EQ(reserved(allocator), 4 * MiB) << "3 MiB maps two 2 MiB pages";
  void* second = allocate_ok(allocator, 3 * MiB);
  // The free MiB at the tail grew by one page: the block follows the first.
  EXPECT_EQ(address_of(second), address_of(first) + 3 * MiB);
  EXPECT_EQ(reserved(allocator), 6 * MiB);
  EXPECT_EQ(allocator.stats().segment.current, 1);
  EXPECT_EQ(static_cast<std::size_t>(reserved(allocator)), device.mapped_bytes());
  EXPECT_EQ(device.used_bytes(), device.mapped_bytes()) << "no cudaMalloc'd slab";
  EXPECT_EQ(allocator.deallocate(first), Status::ok);
  EXPECT_EQ(allocator.deallocate(second), Status::ok);
}

TEST(ExpandableSegments, AFreedTailIsUnmappedAndReservedDrops) {
  SimDevice device(sim_options(1024 * MiB));
  RecordingTraceSink trace;
  CachingAllocator allocator(device, expandable_options(512 * MiB), &trace);
  void* first = allocate_ok(allocator, 3 * MiB);
  void* second = allocate_ok(allocator, 5 * MiB);
  EXPECT_EQ(reserved(allocator), 8 * MiB);
  ASSERT_EQ(allocator.deallocate(second), Status::ok);
  allocator.empty_cache();
  // The tail's whole pages go; the page the first block ends in stays.
  EXPECT_EQ(reserved(allocator), 4 * MiB);
  EXPECT_EQ(device.mapped_bytes(), 4 * MiB);
  EXPECT_TRUE(device.is_mapped(first, 3 * MiB));
  EXPECT_FALSE(device.is_mapped(static_cast<char*>(first) + 4 * MiB, 1));
  ASSERT_EQ(allocator.deallocate(first), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(allocator.stats().segment.current, 0) << "the address range went back too";
  // Segment events account for every mapped and unmapped byte.
  std::int64_t mapped = 0;
  for (const TraceEvent& event : trace.of_kind(TraceEventKind::segment_alloc))
    mapped += static_cast<std::int64_t>(event.size);
  for (const TraceEvent& event : trace.of_kind(TraceEventKind::segment_free))
    mapped -= static_cast<std::int64_t>(event.size);
  EXPECT_EQ(mapped, 0);
  // And it grows again from nothing.
  void* again = allocate_ok(allocator, 2 * MiB);
  EXPECT_EQ(reserved(allocator), 2 * MiB);
  EXPECT_EQ(allocator.deallocate(again), Status::ok);
}

// Free pages inside the segment are unmapped too, and a later request maps
// them again in place.
TEST(ExpandableSegments, FreePagesInsideAreUnmappedAndMappedAgain) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  auto* first = static_cast<char*>(allocate_ok(allocator, 3 * MiB));  // [0, 3) MiB
  void* middle = allocate_ok(allocator, 4 * MiB);                     // [3, 7)
  void* last = allocate_ok(allocator, 3 * MiB);                       // [7, 10)
  ASSERT_EQ(middle, first + 3 * MiB);
  ASSERT_EQ(last, first + 7 * MiB);
  EXPECT_EQ(reserved(allocator), 10 * MiB);
  ASSERT_EQ(allocator.deallocate(middle), Status::ok);
  allocator.empty_cache();
  // The pages wholly inside [3, 7) are [4, 6): they go, the shared ones stay.
  EXPECT_EQ(reserved(allocator), 8 * MiB);
  EXPECT_EQ(device.mapped_bytes(), 8 * MiB);
  EXPECT_FALSE(device.is_mapped(first + 4 * MiB, 1));
  EXPECT_TRUE(device.is_mapped(first, 4 * MiB));
  EXPECT_TRUE(device.is_mapped(first + 6 * MiB, 4 * MiB));
  // 4 MiB fits nowhere mapped; the hole and its free neighbours hold it.
  void* again = allocate_ok(allocator, 4 * MiB);
  EXPECT_EQ(again, middle);
  EXPECT_EQ(reserved(allocator), 10 * MiB);
  EXPECT_TRUE(device.is_mapped(again, 4 * MiB));
  std::memset(again, 0x3C, 4 * MiB);
  for (void* ptr : {static_cast<void*>(first), again, last})
    ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(allocator.stats().segment.current, 0);
}

// Holes at the end of the segment leave it, and the segment grows from its
// last mapped block again.
TEST(ExpandableSegments, AHoleAtTheEndLeavesTheSegment) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  auto* first = static_cast<char*>(allocate_ok(allocator, 4 * MiB));  // [0, 4)
  void* second = allocate_ok(allocator, 4 * MiB);                     // [4, 8)
  void* third = allocate_ok(allocator, 4 * MiB);                      // [8, 12)
  ASSERT_EQ(allocator.deallocate(second), Status::ok);
  allocator.empty_cache();  // [4, 8) becomes a hole
  EXPECT_EQ(reserved(allocator), 8 * MiB);
  ASSERT_EQ(allocator.deallocate(third), Status::ok);
  allocator.empty_cache();  // [8, 12) leaves, and the hole before it
  EXPECT_EQ(reserved(allocator), 4 * MiB);
  void* grown = allocate_ok(allocator, 6 * MiB);
  EXPECT_EQ(grown, first + 4 * MiB) << "the segment grew from its last mapped block";
  EXPECT_EQ(reserved(allocator), 10 * MiB);
  for (void* ptr : {static_cast<void*>(first), grown})
    ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.mapped_bytes(), 0u);
}

// A freed 6 MiB block at the end of a slab strands it for a 9 MiB request
// (a second slab); in an expandable segment the free tail grows instead.
TEST(ExpandableSegments, ALargerBlockAfterAFreeReusesTheFreeTail) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  void* small_first = allocate_ok(allocator, 6 * MiB);
  ASSERT_EQ(allocator.deallocate(small_first), Status::ok);
  const std::int64_t device_allocs = allocator.stats().num_device_alloc;
  void* larger = allocate_ok(allocator, 9 * MiB);
  EXPECT_EQ(larger, small_first) << "the free tail grew in place";
  EXPECT_EQ(reserved(allocator), 10 * MiB);
  EXPECT_EQ(allocator.stats().segment.current, 1);
  EXPECT_EQ(allocator.stats().num_device_alloc, device_allocs + 1) << "one more page mapping";
  EXPECT_EQ(allocator.deallocate(larger), Status::ok);

  SimDevice slab_device(sim_options(1024 * MiB));
  CachingAllocator slabs(slab_device, allocator_options(512 * MiB, 8 * MiB));
  void* slab_first = allocate_ok(slabs, 6 * MiB);
  ASSERT_EQ(slabs.deallocate(slab_first), Status::ok);
  void* slab_larger = allocate_ok(slabs, 9 * MiB);
  EXPECT_EQ(reserved(slabs), 18 * MiB) << "the 8 MiB slab is stranded beside a new segment";
  EXPECT_EQ(slabs.deallocate(slab_larger), Status::ok);
}

TEST(ExpandableSegments, LargeBlocksGetSegmentsOfTheirOwnAndAChunkAWholeSlab) {
  SimDevice device(sim_options(1024 * MiB));
  const std::size_t chunk = 64'000'000;
  CachingAllocator allocator(device, expandable_options(512 * MiB, chunk));
  void* large = allocate_ok(allocator, 12 * MiB + 1);
  EXPECT_EQ(reserved(allocator), 14 * MiB) << "rounded to 2 MiB";
  EXPECT_EQ(device.mapped_bytes(), 0u) << "not from the expandable segment";
  void* chunk_block = allocate_ok(allocator, chunk);
  EXPECT_EQ(reserved(allocator), static_cast<std::int64_t>(14 * MiB + chunk));
  EXPECT_EQ(device.allocation_size(chunk_block), chunk) << "a chunk is exactly one slab";
  EXPECT_EQ(allocator.deallocate(large), Status::ok);
  EXPECT_EQ(allocator.deallocate(chunk_block), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
}

// Note [Outgrown segments]: a large miss returns the stream's free segments
// between half its size and its size, and keeps smaller ones and other
// streams'.
TEST(ExpandableSegments, ALargeMissReturnsTheSegmentsItOutgrew) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  Stream other;
  ASSERT_EQ(device.create_stream(&other), Status::ok);
  void* earlier_shape = allocate_ok(allocator, 12 * MiB);
  void* half = allocate_ok(allocator, 10 * MiB);
  void* other_stream = allocate_ok(allocator, 12 * MiB, other);
  for (void* ptr : {earlier_shape, half, other_stream})
    ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
  EXPECT_EQ(reserved(allocator), 34 * MiB);
  const std::int64_t device_frees = allocator.stats().num_device_free;

  void* larger = allocate_ok(allocator, 20 * MiB);
  EXPECT_EQ(allocator.stats().num_device_free, device_frees + 1);
  EXPECT_EQ(reserved(allocator), 34 * MiB - 12 * MiB + 20 * MiB)
      << "the 12 MiB segment went back; the 10 MiB one and the other stream's stayed";
  void* reused_half = allocate_ok(allocator, 10 * MiB);
  EXPECT_EQ(reused_half, half);
  for (void* ptr : {larger, reused_half}) EXPECT_EQ(allocator.deallocate(ptr), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.destroy_stream(other), Status::ok);
}

TEST(ExpandableSegments, TheBudgetHoldsAndOutOfMemoryIsClean) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(16 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(allocate_ok(allocator, 3 * MiB));
  EXPECT_EQ(reserved(allocator), 16 * MiB);
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate(&ptr, 3 * MiB, Stream{}), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_THAT(CachingAllocator::last_error(), ::testing::HasSubstr("budget"));
  EXPECT_LE(reserved(allocator), 16 * MiB);
  EXPECT_EQ(static_cast<std::size_t>(reserved(allocator)), device.mapped_bytes());
  // Still serving: a freed block is reused.
  ASSERT_EQ(allocator.deallocate(blocks.back()), Status::ok);
  blocks.back() = allocate_ok(allocator, 3 * MiB);
  for (void* block : blocks) EXPECT_EQ(allocator.deallocate(block), Status::ok);
}

TEST(ExpandableSegments, RefusedPagesFallBackToASlab) {
  SimDevice device(sim_options(1024 * MiB));
  CachingAllocator allocator(device, expandable_options(512 * MiB));
  device.fail_nth_malloc(1);  // the page mapping
  void* block = allocate_ok(allocator, 3 * MiB);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(device.allocation_size(block), 20 * MiB) << "a mid-size slab";
  EXPECT_EQ(allocator.deallocate(block), Status::ok);
}

// Random blocks, frees and cache releases: every live block stays mapped and
// intact (an unmapped page would fault), and reserved bytes are always what
// the device holds.
TEST(ExpandableSegments, RandomUseKeepsLiveBlocksMappedAndReservedExact) {
  SimDevice device(sim_options(2048 * MiB));
  CachingAllocator allocator(device, expandable_options(1024 * MiB));
  std::mt19937 random(11);
  std::vector<std::pair<unsigned char*, std::size_t>> live;
  for (int i = 0; i < 3000; ++i) {
    const unsigned op = random() % 10;
    if (op == 0) {
      allocator.empty_cache();
    } else if (op < 5 && !live.empty()) {
      const std::size_t at = random() % live.size();
      ASSERT_EQ(allocator.deallocate(live[at].first), Status::ok);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
    } else if (live.size() < 40) {
      const std::size_t bytes = 512 * KiB + random() % (11 * MiB);
      auto* ptr = static_cast<unsigned char*>(allocate_ok(allocator, bytes));
      ASSERT_NE(ptr, nullptr);
      std::memset(ptr, static_cast<int>(bytes % 251), bytes);
      live.emplace_back(ptr, bytes);
    }
    ASSERT_EQ(static_cast<std::size_t>(reserved(allocator)), device.used_bytes()) << "op " << i;
    for (auto [ptr, bytes] : live) {
      ASSERT_EQ(ptr[0], bytes % 251) << "op " << i;
      ASSERT_EQ(ptr[bytes - 1], bytes % 251) << "op " << i;
    }
  }
  for (auto [ptr, bytes] : live) ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.used_bytes(), 0u);
}

// Each stream grows its own segment; blocks never overlap (each thread
// writes its pattern and checks it before freeing), and everything goes back.
TEST(ExpandableSegments, StreamsAndThreadsEachGrowTheirOwnSegment) {
  SimDevice device(sim_options(2048 * MiB));
  CachingAllocator allocator(device, expandable_options(1024 * MiB));
  constexpr int kThreads = 4;
  std::vector<Stream> streams(kThreads);
  for (Stream& stream : streams) ASSERT_EQ(device.create_stream(&stream), Status::ok);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t + 1));
      std::vector<std::pair<unsigned char*, std::size_t>> live;
      const auto pattern = static_cast<unsigned char>(0x10 + t);
      for (int i = 0; i < 300; ++i) {
        if (random() % 50 == 0) allocator.empty_cache();  // unmaps free pages under the others
        if (live.size() > 8 || (!live.empty() && random() % 3 == 0)) {
          const std::size_t at = random() % live.size();
          auto [ptr, bytes] = live[at];
          if (ptr[0] != pattern || ptr[bytes - 1] != pattern) ++failures;
          if (allocator.deallocate(ptr) != Status::ok) ++failures;
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
          continue;
        }
        const std::size_t bytes = 512 * KiB + random() % (12 * MiB);
        void* ptr = nullptr;
        if (allocator.allocate(&ptr, bytes, streams[t]) != Status::ok) {
          ++failures;
          continue;
        }
        std::memset(ptr, pattern, bytes);
        live.emplace_back(static_cast<unsigned char*>(ptr), bytes);
      }
      for (auto [ptr, bytes] : live) {
        if (ptr[0] != pattern || ptr[bytes - 1] != pattern) ++failures;
        if (allocator.deallocate(ptr) != Status::ok) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(allocator.stats().reserved_bytes.peak, 1024 * MiB);
  EXPECT_EQ(static_cast<std::size_t>(reserved(allocator)), device.used_bytes());
  allocator.empty_cache();
  EXPECT_EQ(reserved(allocator), 0);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(device.used_bytes(), 0u);
  for (Stream stream : streams) EXPECT_EQ(device.destroy_stream(stream), Status::ok);
}

}  // namespace
}  // namespace spillway::testing
