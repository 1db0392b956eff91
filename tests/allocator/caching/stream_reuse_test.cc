// record_stream and deferred frees: a block freed on its stream A after
// record_stream on B is not handed out again before B's work at free time
// has completed, and is handed out once it has.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

class CachingAllocatorStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(device_.create_stream(&a_), Status::ok);
    ASSERT_EQ(device_.create_stream(&b_), Status::ok);
  }
  void TearDown() override {
    gate_.open();
    device_.synchronize();
  }
  Stats stats() const { return allocator_.stats(); }

  SimDevice device_{sim_options(256 * MiB)};
  CachingAllocator allocator_{device_, allocator_options(64 * MiB)};
  Stream a_, b_;
  StreamGate gate_;  // after the device: destroyed first
};

TEST_F(CachingAllocatorStreams, BlockUsedOnAnotherStreamWaitsForThatStream) {
  void* p = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(allocator_.record_stream(p, b_), Status::ok);
  gate_.hold(device_, b_);  // B is busy, as if a kernel on B still read p
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);
  EXPECT_EQ(stats().allocated_bytes.current, 0);
  EXPECT_EQ(stats().active_bytes.current, static_cast<std::int64_t>(4 * KiB));

  // While B is busy, no request on A gets p.
  std::vector<void*> others;
  for (int i = 0; i < 8; ++i) {
    void* q = allocate_ok(allocator_, 4 * KiB, a_);
    EXPECT_NE(q, p);
    others.push_back(q);
  }
  for (void* q : others) ASSERT_EQ(allocator_.deallocate(q), Status::ok);
  void* again = allocate_ok(allocator_, 4 * KiB, a_);
  EXPECT_NE(again, p);
  ASSERT_EQ(allocator_.deallocate(again), Status::ok);

  gate_.open();
  ASSERT_EQ(device_.synchronize_stream(b_), Status::ok);
  // B has finished: the next call collects the event and p is free again.
  EXPECT_EQ(allocate_ok(allocator_, 4 * KiB, a_), p);
  EXPECT_EQ(stats().active_bytes.current, stats().allocated_bytes.current);
}

TEST_F(CachingAllocatorStreams, SlowCopyOnTheOtherStreamDelaysReuse) {
  device_.set_copy_delay_ns(300'000'000);  // 300 ms
  void* p = allocate_ok(allocator_, 64 * KiB, a_);
  std::vector<char> host(64 * KiB);
  ASSERT_EQ(device_.copy_async(host.data(), p, host.size(), b_), Status::ok);
  Event copied;
  ASSERT_EQ(device_.create_event(&copied), Status::ok);
  ASSERT_EQ(device_.record_event(copied, b_), Status::ok);
  ASSERT_EQ(allocator_.record_stream(p, b_), Status::ok);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);

  void* q = allocate_ok(allocator_, 64 * KiB, a_);
  ASSERT_EQ(device_.query_event(copied), Status::not_ready) << "the copy ended too early to tell";
  EXPECT_NE(q, p);

  ASSERT_EQ(device_.synchronize_event(copied), Status::ok);
  EXPECT_EQ(allocate_ok(allocator_, 64 * KiB, a_), p);
  ASSERT_EQ(device_.destroy_event(copied), Status::ok);
}

TEST_F(CachingAllocatorStreams, RecordStreamOnTheOwnStreamChangesNothing) {
  void* p = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(allocator_.record_stream(p, a_), Status::ok);
  gate_.hold(device_, a_);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);
  EXPECT_EQ(stats().active_bytes.current, 0);
  EXPECT_EQ(allocate_ok(allocator_, 4 * KiB, a_), p);  // stream order covers it
}

TEST_F(CachingAllocatorStreams, BlockWaitsForEveryStreamItWasUsedOn) {
  Stream c;
  ASSERT_EQ(device_.create_stream(&c), Status::ok);
  StreamGate gate_c;
  void* p = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(allocator_.record_stream(p, b_), Status::ok);
  ASSERT_EQ(allocator_.record_stream(p, c), Status::ok);
  ASSERT_EQ(allocator_.record_stream(p, c), Status::ok);  // twice: one event
  gate_.hold(device_, b_);
  gate_c.hold(device_, c);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);

  gate_.open();
  ASSERT_EQ(device_.synchronize_stream(b_), Status::ok);
  void* q = allocate_ok(allocator_, 4 * KiB, a_);
  EXPECT_NE(q, p);  // C still holds it
  gate_c.open();
  ASSERT_EQ(device_.synchronize_stream(c), Status::ok);
  ASSERT_EQ(allocator_.deallocate(q), Status::ok);  // collects the events too
  EXPECT_EQ(stats().active_bytes.current, 0);
  void* r = allocate_ok(allocator_, 4 * KiB, a_);
  EXPECT_EQ(r, p);
}

TEST_F(CachingAllocatorStreams, RecordedStreamsAreForgottenOnceTheBlockIsFree) {
  void* p = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(allocator_.record_stream(p, b_), Status::ok);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);
  ASSERT_EQ(device_.synchronize_stream(b_), Status::ok);
  void* again = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(again, p);
  // Reused without record_stream: a busy B no longer holds it back.
  gate_.hold(device_, b_);
  ASSERT_EQ(allocator_.deallocate(again), Status::ok);
  EXPECT_EQ(allocate_ok(allocator_, 4 * KiB, a_), p);
}

TEST_F(CachingAllocatorStreams, EmptyCacheWaitsForDeferredFrees) {
  void* p = allocate_ok(allocator_, 4 * KiB, a_);
  ASSERT_EQ(allocator_.record_stream(p, b_), Status::ok);
  gate_.hold(device_, b_);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);
  std::thread opener([this] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate_.open();
  });
  allocator_.empty_cache();
  opener.join();
  EXPECT_EQ(device_.used_bytes(), 0u);
  EXPECT_EQ(stats().active_bytes.current, 0);
  EXPECT_EQ(stats().reserved_bytes.current, 0);
}

TEST(CachingAllocatorStreamsUnderBudget, AllocationWaitsForDeferredFreesBeforeGivingUp) {
  SimDevice device(sim_options(64 * MiB));
  Stream a, b;
  ASSERT_EQ(device.create_stream(&a), Status::ok);
  ASSERT_EQ(device.create_stream(&b), Status::ok);
  CachingAllocator allocator(device, allocator_options(2 * MiB));
  StreamGate gate;
  void* p = allocate_ok(allocator, 1 * MiB, a);
  void* q = allocate_ok(allocator, 1 * MiB, a);  // the budget is full
  ASSERT_EQ(allocator.record_stream(p, b), Status::ok);
  gate.hold(device, b);
  ASSERT_EQ(allocator.deallocate(p), Status::ok);
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.open();
  });
  void* r = allocate_ok(allocator, 1 * MiB, a);  // waits for B instead of failing
  opener.join();
  EXPECT_EQ(r, p);
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  EXPECT_EQ(allocator.stats().num_alloc_retries, 1);
  ASSERT_EQ(allocator.deallocate(q), Status::ok);
  ASSERT_EQ(allocator.deallocate(r), Status::ok);
  device.synchronize();
}

// Note [Time spent giving memory back]: returning a segment waits for the
// device's queued work, and the allocator counts that wait.
TEST_F(CachingAllocatorStreams, GivingMemoryBackCountsTheWaitForQueuedWork) {
  device_.set_copy_delay_ns(50'000'000);  // 50 ms
  void* p = allocate_ok(allocator_, 64 * KiB, a_);
  ASSERT_EQ(allocator_.deallocate(p), Status::ok);
  std::vector<char> host(64 * KiB), source(64 * KiB);
  ASSERT_EQ(device_.copy_async(host.data(), source.data(), host.size(), b_), Status::ok);
  EXPECT_EQ(allocator_.release_wait_ns(), 0u);
  allocator_.empty_cache();  // the free of p's segment waits for the copy on B
  EXPECT_EQ(stats().reserved_bytes.current, 0);
  EXPECT_GT(allocator_.release_wait_ns(), 0u);
}

}  // namespace
}  // namespace spillway::testing
