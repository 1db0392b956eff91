// Note [Fenced slabs] (caching_allocator.cc): with virtual memory, a chunk's
// slab (and a small slab) is mapped pages, and giving it back to the device
// waits for its fence, or its own stream, or nothing when idle: never for the
// whole device. Each wait is checked against a stream held busy by a gate: a
// release that must not wait finishes while the gate is held, one that must
// wait does not.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

constexpr std::size_t kSlab = 2 * MiB;  // the chunk size; the simulated page is 2 MiB too

CachingAllocatorOptions expandable_options(std::size_t budget_bytes) {
  CachingAllocatorOptions options = allocator_options(budget_bytes, kSlab);
  options.expandable_segments = true;
  return options;
}

class FencedSlabs : public ::testing::Test {
 protected:
  void SetUp() override {
    for (Stream* stream : {&a_, &b_, &x_}) ASSERT_EQ(device_.create_stream(stream), Status::ok);
  }
  void TearDown() override {
    gate_.open();
    device_.synchronize();
  }

  // Runs `work` on a thread while `gate` holds its stream; true when it
  // finished without the gate opening. The gate is open afterwards.
  static bool finishes_while_held(StreamGate& gate, const std::function<void()>& work) {
    const auto patience = std::chrono::milliseconds(300);
    std::atomic<bool> done{false};
    std::thread worker([&] {
      work();
      done.store(true);
    });
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!done.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool finished = done.load();
    gate.open();
    worker.join();
    return finished;
  }

  SimDevice device_{sim_options(256 * MiB)};
  CachingAllocator allocator_{device_, expandable_options(64 * MiB)};
  Stream a_, b_, x_;
  StreamGate gate_;  // after the device: destroyed first
};

TEST_F(FencedSlabs, ChunkSlabsAndSmallSlabsAreMappedPages) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  void* small = allocate_ok(allocator_, 4 * KiB, a_);
  EXPECT_TRUE(device_.is_mapped(chunk, kSlab));
  EXPECT_TRUE(device_.is_mapped(small, 4 * KiB));
  ASSERT_EQ(allocator_.deallocate(chunk), Status::ok);
  ASSERT_EQ(allocator_.deallocate(small), Status::ok);
  allocator_.empty_cache();
  EXPECT_FALSE(device_.is_mapped(chunk, kSlab));
  EXPECT_EQ(allocator_.stats().reserved_bytes.current, 0);
}

TEST_F(FencedSlabs, AFencedSlabGoesBackWithoutWaitingForOtherStreams) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  ASSERT_EQ(allocator_.deallocate_after(chunk, b_), Status::ok);  // b has nothing queued
  gate_.hold(device_, x_);  // unrelated work that a cudaFree would wait for
  EXPECT_TRUE(finishes_while_held(gate_, [&] { allocator_.empty_cache(); }));
  EXPECT_FALSE(device_.is_mapped(chunk, kSlab));
  EXPECT_EQ(allocator_.stats().reserved_bytes.current, 0);
}

TEST_F(FencedSlabs, AFencedSlabDoesNotGoBackBeforeItsFence) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  gate_.hold(device_, b_);  // its last user, still running
  ASSERT_EQ(allocator_.deallocate_after(chunk, b_), Status::ok);
  EXPECT_FALSE(finishes_while_held(gate_, [&] { allocator_.empty_cache(); }));
  EXPECT_FALSE(device_.is_mapped(chunk, kSlab));  // once the fence passed
}

// A chunk larger than chunk_size is no slab but a block of an expandable
// segment: freed after its users, it is neither handed out again nor unmapped
// while they may still read it (the write-back of an evicted chunk, say).
TEST_F(FencedSlabs, ABlockFreedAfterItsUsersWaitsForThemToo) {
  void* block = allocate_ok(allocator_, 2 * kSlab, a_);
  gate_.hold(device_, b_);  // its last user, still running
  ASSERT_EQ(allocator_.deallocate_after(block, b_), Status::ok);
  void* next = allocate_ok(allocator_, 2 * kSlab, a_);
  EXPECT_NE(next, block);  // not handed out while b may read it
  bool still_mapped = false;
  const bool finished = finishes_while_held(gate_, [&] {
    allocator_.empty_cache();
    still_mapped = device_.is_mapped(block, 2 * kSlab);
  });
  EXPECT_TRUE(!finished || still_mapped);  // not unmapped while b may read it
  ASSERT_EQ(allocator_.deallocate(next), Status::ok);
}

TEST_F(FencedSlabs, AnIdleSlabGoesBackWithoutAnyWait) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  gate_.hold(device_, a_);  // even its own stream is busy
  ASSERT_EQ(allocator_.deallocate_idle(chunk), Status::ok);
  EXPECT_TRUE(finishes_while_held(gate_, [&] { allocator_.empty_cache(); }));
  EXPECT_FALSE(device_.is_mapped(chunk, kSlab));
}

TEST_F(FencedSlabs, APlainlyFreedSlabWaitsForItsOwnStream) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  ASSERT_EQ(allocator_.deallocate(chunk), Status::ok);
  gate_.hold(device_, a_);
  EXPECT_FALSE(finishes_while_held(gate_, [&] { allocator_.empty_cache(); }));
}

TEST_F(FencedSlabs, APlainlyFreedSlabWaitsForNoOtherStream) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  ASSERT_EQ(allocator_.deallocate(chunk), Status::ok);
  gate_.hold(device_, x_);
  EXPECT_TRUE(finishes_while_held(gate_, [&] { allocator_.empty_cache(); }));
}

TEST_F(FencedSlabs, ItsOwnStreamReusesAFencedSlabAtOnce) {
  void* chunk = allocate_ok(allocator_, kSlab, a_);
  gate_.hold(device_, b_);
  ASSERT_EQ(allocator_.deallocate_after(chunk, b_), Status::ok);
  void* again = nullptr;
  EXPECT_TRUE(finishes_while_held(gate_, [&] { again = allocate_ok(allocator_, kSlab, a_); }));
  EXPECT_EQ(again, chunk) << "the stream's own work queues behind the old user's";
  ASSERT_EQ(allocator_.deallocate(again), Status::ok);
}

// A request that does not fit: the slab that needs no wait goes back first,
// and the one behind a busy fence stays.
TEST_F(FencedSlabs, UnderPressureTheSlabsThatNeedNoWaitGoBackFirst) {
  CachingAllocator allocator(device_, expandable_options(2 * kSlab));
  void* ready = allocate_ok(allocator, kSlab, a_);
  void* fenced = allocate_ok(allocator, kSlab, a_);
  gate_.hold(device_, b_);
  ASSERT_EQ(allocator.deallocate_after(fenced, b_), Status::ok);
  ASSERT_EQ(allocator.deallocate_idle(ready), Status::ok);
  void* other = nullptr;
  EXPECT_TRUE(finishes_while_held(gate_, [&] { other = allocate_ok(allocator, kSlab, x_); }));
  EXPECT_TRUE(device_.is_mapped(fenced, kSlab)) << "it waited for nothing it did not need";
  EXPECT_EQ(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(2 * kSlab));
  ASSERT_EQ(allocator.deallocate(other), Status::ok);
  device_.synchronize();
}

}  // namespace
}  // namespace spillway::testing
