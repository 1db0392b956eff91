// CachingAllocator on SimDevice: rounding, pools, split and coalesce, best
// fit, stream ownership, empty_cache, bad pointers, trace events.
#include "allocator/caching/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

class CachingAllocatorTest : public ::testing::Test {
 protected:
  SimDevice device_{sim_options(256 * MiB)};
  std::optional<CachingAllocator> allocator_{std::in_place, device_,
                                             allocator_options(128 * MiB, 8 * MiB)};
  CachingAllocator& allocator() { return *allocator_; }
  Stats stats() const { return allocator_->stats(); }
};

TEST_F(CachingAllocatorTest, RoundsRequestsTo512Bytes) {
  void* one = allocate_ok(allocator(), 1);
  EXPECT_EQ(stats().allocated_bytes.current, 512);
  void* exact = allocate_ok(allocator(), 512);
  EXPECT_EQ(stats().allocated_bytes.current, 1024);
  void* over = allocate_ok(allocator(), 513);
  EXPECT_EQ(stats().allocated_bytes.current, 2048);
  // Carved one after another from the same small slab.
  EXPECT_EQ(address_of(exact) - address_of(one), 512u);
  EXPECT_EQ(address_of(over) - address_of(exact), 512u);
  EXPECT_EQ(address_of(one) % 256, 0u);  // the device aligns segments to 256
  EXPECT_EQ(stats().segment.current, 1);
}

TEST_F(CachingAllocatorTest, ZeroBytesGivesNullAndOk) {
  void* ptr = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(allocator().allocate(&ptr, 0, {}), Status::ok);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(allocator().deallocate(nullptr), Status::ok);
  EXPECT_EQ(stats().allocation.allocated, 0);
  EXPECT_EQ(stats().num_device_alloc, 0);
}

TEST_F(CachingAllocatorTest, SmallRequestsShareTwoMiBSlabs) {
  void* a = allocate_ok(allocator(), 1 * MiB);
  EXPECT_EQ(device_.allocation_size(a), CachingAllocator::kSmallSlabBytes);
  void* b = allocate_ok(allocator(), 1 * MiB);  // the slab's other half
  EXPECT_EQ(address_of(b), address_of(a) + 1 * MiB);
  EXPECT_EQ(stats().reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  void* c = allocate_ok(allocator(), 4 * KiB);  // a second slab
  EXPECT_EQ(device_.allocation_size(c), 2 * MiB);
  EXPECT_EQ(stats().segment.current, 2);
}

TEST_F(CachingAllocatorTest, LargeRequestsShareLargeSlabs) {
  void* a = allocate_ok(allocator(), 1 * MiB + 1);
  EXPECT_EQ(device_.allocation_size(a), 8 * MiB);
  EXPECT_EQ(stats().allocated_bytes.current, static_cast<std::int64_t>(1 * MiB + 512));
  void* b = allocate_ok(allocator(), 3 * MiB);
  EXPECT_EQ(address_of(b), address_of(a) + 1 * MiB + 512);
  EXPECT_EQ(stats().segment.current, 1);
  // A small request does not come from the large slab's free rest.
  void* small = allocate_ok(allocator(), 512);
  EXPECT_EQ(device_.allocation_size(small), 2 * MiB);
  EXPECT_EQ(stats().segment.current, 2);
}

TEST_F(CachingAllocatorTest, OversizeRequestsGetTheirOwnSegmentRoundedTo2MiB) {
  void* big = allocate_ok(allocator(), 8 * MiB + 1);
  EXPECT_EQ(device_.allocation_size(big), 10 * MiB);
  EXPECT_EQ(stats().allocated_bytes.current, static_cast<std::int64_t>(8 * MiB + 512));
  EXPECT_EQ(stats().reserved_bytes.current, static_cast<std::int64_t>(10 * MiB));
  // The 2 MiB - 512 rest is above 1 MiB: cached as a block of its own.
  void* rest = allocate_ok(allocator(), 1 * MiB + 512);
  EXPECT_EQ(address_of(rest), address_of(big) + 8 * MiB + 512);
  EXPECT_EQ(stats().segment.current, 1);
}

TEST_F(CachingAllocatorTest, LargeSlabSizedRequestTakesAWholeSlab) {
  void* chunk = allocate_ok(allocator(), 8 * MiB);
  EXPECT_EQ(device_.allocation_size(chunk), 8 * MiB);
  void* chunk2 = allocate_ok(allocator(), 8 * MiB);
  EXPECT_EQ(device_.allocation_size(chunk2), 8 * MiB);
  EXPECT_EQ(stats().reserved_bytes.current, static_cast<std::int64_t>(16 * MiB));
}

TEST_F(CachingAllocatorTest, FreedNeighboursCoalesceIntoOneBlock) {
  void* a = allocate_ok(allocator(), 2 * MiB);
  void* b = allocate_ok(allocator(), 2 * MiB);
  void* c = allocate_ok(allocator(), 2 * MiB);
  ASSERT_EQ(address_of(b), address_of(a) + 2 * MiB);
  ASSERT_EQ(address_of(c), address_of(b) + 2 * MiB);
  ASSERT_EQ(allocator().deallocate(b), Status::ok);
  // A 4 MiB hole only exists once a and b merge.
  ASSERT_EQ(allocator().deallocate(a), Status::ok);
  void* ab = allocate_ok(allocator(), 4 * MiB);
  EXPECT_EQ(ab, a);
  ASSERT_EQ(allocator().deallocate(ab), Status::ok);
  ASSERT_EQ(allocator().deallocate(c), Status::ok);
  // Everything merged back: the slab is one 8 MiB block again.
  void* whole = allocate_ok(allocator(), 8 * MiB);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(stats().num_device_alloc, 1);
  ASSERT_EQ(allocator().deallocate(whole), Status::ok);
}

TEST_F(CachingAllocatorTest, FreeingTheMiddleBlockLastMergesBothSides) {
  void* a = allocate_ok(allocator(), 100 * KiB);
  void* b = allocate_ok(allocator(), 100 * KiB);
  void* c = allocate_ok(allocator(), 100 * KiB);
  ASSERT_EQ(allocator().deallocate(a), Status::ok);
  ASSERT_EQ(allocator().deallocate(c), Status::ok);
  ASSERT_EQ(allocator().deallocate(b), Status::ok);
  void* whole = allocate_ok(allocator(), 1 * MiB);
  void* whole2 = allocate_ok(allocator(), 1 * MiB);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(address_of(whole2), address_of(a) + 1 * MiB);
  EXPECT_EQ(stats().num_device_alloc, 1);
}

TEST_F(CachingAllocatorTest, SmallPoolSplitsRemaindersOf512Bytes) {
  void* a = allocate_ok(allocator(), 1 * MiB);
  void* b = allocate_ok(allocator(), 1 * MiB - 512);
  EXPECT_EQ(stats().allocated_bytes.current, static_cast<std::int64_t>(2 * MiB - 512));
  void* tail = allocate_ok(allocator(), 512);  // the last 512 bytes of the slab
  EXPECT_EQ(address_of(tail), address_of(a) + 2 * MiB - 512);
  EXPECT_EQ(stats().segment.current, 1);
  (void)b;
}

TEST_F(CachingAllocatorTest, LargePoolKeepsRemaindersOfAtMost1MiBInTheBlock) {
  void* a = allocate_ok(allocator(), 7 * MiB);  // rest: exactly 1 MiB, not split off
  EXPECT_EQ(stats().allocated_bytes.current, static_cast<std::int64_t>(8 * MiB));
  ASSERT_EQ(allocator().deallocate(a), Status::ok);
  EXPECT_EQ(stats().allocated_bytes.current, 0);
  void* b = allocate_ok(allocator(), 7 * MiB - 512);  // rest: 1 MiB + 512, split off
  EXPECT_EQ(stats().allocated_bytes.current, static_cast<std::int64_t>(7 * MiB - 512));
  void* rest = allocate_ok(allocator(), 1 * MiB + 512);
  EXPECT_EQ(address_of(rest), address_of(b) + 7 * MiB - 512);
  EXPECT_EQ(stats().segment.current, 1);
}

TEST_F(CachingAllocatorTest, PicksTheSmallestFreeBlockThatFits) {
  // Holes of 4, 16 and 8 KiB, kept apart by live 512-byte blocks.
  void* hole4 = allocate_ok(allocator(), 4 * KiB);
  void* wall1 = allocate_ok(allocator(), 512);
  void* hole16 = allocate_ok(allocator(), 16 * KiB);
  void* wall2 = allocate_ok(allocator(), 512);
  void* hole8 = allocate_ok(allocator(), 8 * KiB);
  void* wall3 = allocate_ok(allocator(), 512);
  for (void* hole : {hole4, hole16, hole8}) ASSERT_EQ(allocator().deallocate(hole), Status::ok);

  EXPECT_EQ(allocate_ok(allocator(), 6 * KiB), hole8);
  EXPECT_EQ(allocate_ok(allocator(), 3 * KiB), hole4);
  EXPECT_EQ(allocate_ok(allocator(), 10 * KiB), hole16);
  // The 16 KiB hole was split: its 6 KiB rest is the best fit now.
  EXPECT_EQ(address_of(allocate_ok(allocator(), 5 * KiB)), address_of(hole16) + 10 * KiB);
  (void)wall1, (void)wall2, (void)wall3;
}

TEST_F(CachingAllocatorTest, EqualSizedFreeBlocksGoLowestAddressFirst) {
  void* first = allocate_ok(allocator(), 4 * KiB);
  void* wall1 = allocate_ok(allocator(), 512);
  void* second = allocate_ok(allocator(), 4 * KiB);
  void* wall2 = allocate_ok(allocator(), 512);
  ASSERT_EQ(allocator().deallocate(second), Status::ok);
  ASSERT_EQ(allocator().deallocate(first), Status::ok);
  EXPECT_EQ(allocate_ok(allocator(), 4 * KiB), first);
  EXPECT_EQ(allocate_ok(allocator(), 4 * KiB), second);
  (void)wall1, (void)wall2;
}

TEST_F(CachingAllocatorTest, BlocksAreReusedOnlyOnTheirOwnStream) {
  Stream s1, s2;
  ASSERT_EQ(device_.create_stream(&s1), Status::ok);
  ASSERT_EQ(device_.create_stream(&s2), Status::ok);
  void* on_s1 = allocate_ok(allocator(), 64 * KiB, s1);
  ASSERT_EQ(allocator().deallocate(on_s1), Status::ok);
  void* on_s2 = allocate_ok(allocator(), 64 * KiB, s2);
  EXPECT_NE(on_s2, on_s1);
  EXPECT_EQ(stats().segment.current, 2);  // s2 got a slab of its own
  EXPECT_EQ(allocate_ok(allocator(), 64 * KiB, s1), on_s1);
  // The other way round too (the pools order streams by handle).
  ASSERT_EQ(allocator().deallocate(on_s2), Status::ok);
  void* again_on_s1 = allocate_ok(allocator(), 64 * KiB, s1);
  EXPECT_NE(again_on_s1, on_s2);
  EXPECT_EQ(allocate_ok(allocator(), 64 * KiB, s2), on_s2);
  // And the default stream is a stream like any other.
  ASSERT_EQ(allocator().deallocate(again_on_s1), Status::ok);
  EXPECT_NE(allocate_ok(allocator(), 64 * KiB), again_on_s1);
}

TEST_F(CachingAllocatorTest, EmptyCacheReturnsFreeSlabsOnly) {
  void* small = allocate_ok(allocator(), 4 * KiB);
  void* large = allocate_ok(allocator(), 3 * MiB);
  void* oversize = allocate_ok(allocator(), 20 * MiB);
  void* kept = allocate_ok(allocator(), 2 * MiB);  // shares the large slab with `large`
  EXPECT_EQ(device_.used_bytes(), 2 * MiB + 8 * MiB + 20 * MiB);
  for (void* ptr : {small, large, oversize}) ASSERT_EQ(allocator().deallocate(ptr), Status::ok);
  EXPECT_EQ(device_.used_bytes(), 30 * MiB);  // cached, not returned

  allocator().empty_cache();
  EXPECT_EQ(device_.used_bytes(), 8 * MiB);  // the slab holding `kept` stays
  EXPECT_EQ(stats().reserved_bytes.current, static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(stats().segment.current, 1);
  EXPECT_EQ(stats().num_device_free, 2);

  ASSERT_EQ(allocator().deallocate(kept), Status::ok);
  allocator().empty_cache();
  EXPECT_EQ(device_.used_bytes(), 0u);
  EXPECT_EQ(stats().reserved_bytes.current, 0);
  EXPECT_EQ(stats().num_device_free, stats().num_device_alloc);
  // And it keeps serving.
  ASSERT_EQ(allocator().deallocate(allocate_ok(allocator(), 4 * KiB)), Status::ok);
}

TEST_F(CachingAllocatorTest, UnknownAndDoubleFreedPointersAreRejected) {
  int not_ours = 0;
  EXPECT_EQ(allocator().deallocate(&not_ours), Status::invalid_argument);
  EXPECT_NE(CachingAllocator::last_error().find("deallocate"), std::string::npos);
  void* ptr = allocate_ok(allocator(), 4 * KiB);
  EXPECT_EQ(allocator().deallocate(static_cast<char*>(ptr) + 512), Status::invalid_argument);
  ASSERT_EQ(allocator().deallocate(ptr), Status::ok);
  EXPECT_EQ(allocator().deallocate(ptr), Status::invalid_argument);
  EXPECT_EQ(allocator().record_stream(ptr, {}), Status::invalid_argument);
  EXPECT_NE(CachingAllocator::last_error().find("record_stream"), std::string::npos);
  EXPECT_EQ(stats().allocation.current, 0);
}

TEST_F(CachingAllocatorTest, DestructorReturnsEverySegment) {
  allocate_ok(allocator(), 4 * KiB);
  allocate_ok(allocator(), 3 * MiB);
  void* freed = allocate_ok(allocator(), 30 * MiB);
  ASSERT_EQ(allocator().deallocate(freed), Status::ok);
  EXPECT_GT(device_.used_bytes(), 0u);
  allocator_.reset();
  EXPECT_EQ(device_.used_bytes(), 0u);
}

TEST_F(CachingAllocatorTest, BlocksAreWritableDeviceMemory) {
  void* ptr = allocate_ok(allocator(), 100 * KiB);
  EXPECT_TRUE(device_.is_device_pointer(ptr));
  EXPECT_TRUE(device_.is_device_pointer(static_cast<char*>(ptr) + 100 * KiB - 1));
  std::fill_n(static_cast<char*>(ptr), 100 * KiB, 'x');
  ASSERT_EQ(allocator().deallocate(ptr), Status::ok);
}

TEST(CachingAllocatorTrace, ReportsAllocFreeAndSegmentEvents) {
  SimDevice device(sim_options(64 * MiB));
  RecordingTraceSink sink;
  Stream stream;
  ASSERT_EQ(device.create_stream(&stream), Status::ok);
  {
    CachingAllocator allocator(device, allocator_options(4 * MiB), &sink);
    const std::uint64_t before = device.now_ns();
    void* ptr = allocate_ok(allocator, 1000, stream);
    ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
    allocator.empty_cache();
    void* too_big = nullptr;
    EXPECT_EQ(allocator.allocate(&too_big, 5 * MiB, stream), Status::out_of_memory);

    const std::vector<TraceEvent> events = sink.events();
    ASSERT_EQ(events.size(), 5u);
    const auto id = reinterpret_cast<std::uint64_t>(stream.handle);
    const TraceEventKind kinds[] = {TraceEventKind::segment_alloc, TraceEventKind::alloc,
                                    TraceEventKind::free, TraceEventKind::segment_free,
                                    TraceEventKind::oom};
    const std::uint64_t sizes[] = {2 * MiB, 1000, 1000, 2 * MiB, 5 * MiB};
    std::uint64_t previous_time = before;
    for (std::size_t i = 0; i < events.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(events[i].kind, kinds[i]);
      EXPECT_EQ(events[i].size, sizes[i]);
      EXPECT_EQ(events[i].stream, id);
      EXPECT_GE(events[i].time_ns, previous_time);
      previous_time = events[i].time_ns;
    }
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(events[i].address, address_of(ptr));
  }
  ASSERT_EQ(device.destroy_stream(stream), Status::ok);
}

}  // namespace
}  // namespace spillway::testing
