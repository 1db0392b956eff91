// The budget and the fallback chain: reserved bytes never exceed the budget;
// out-of-memory errors say who holds what and leave the allocator serving;
// device malloc failures and pressure handlers are part of the chain.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/caching/pressure_handler.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

using ::testing::HasSubstr;

// Holds blocks allocated through the allocator and frees them on request,
// as the chunk manager spills chunks.
class BlockHolder final : public PressureHandler {
 public:
  BlockHolder(CachingAllocator& allocator, std::string name)
      : allocator_(allocator), name_(std::move(name)) {}

  void hold(void* ptr, std::size_t bytes) { held_.push_back({ptr, bytes}); }

  std::size_t relieve_pressure(std::size_t bytes, Stream stream) override {
    ++calls;
    last_bytes = bytes;
    last_stream = stream;
    // Called without the allocator's lock: it must be able to look at it.
    stats_seen_in_handler = allocator_.stats().allocation.current;
    std::size_t freed = 0;
    while (freed < bytes && !held_.empty()) {
      EXPECT_EQ(allocator_.deallocate(held_.back().first), Status::ok);
      freed += held_.back().second;
      held_.pop_back();
    }
    return freed;
  }

  std::string describe_holdings() const override {
    return name_ + ": " + std::to_string(held_.size()) + " blocks";
  }

  int calls = 0;
  std::size_t last_bytes = 0;
  Stream last_stream;
  std::int64_t stats_seen_in_handler = -1;

 private:
  CachingAllocator& allocator_;
  std::string name_;
  std::vector<std::pair<void*, std::size_t>> held_;
};

std::size_t device_free_bytes(Device& device) {
  MemoryInfo info;
  EXPECT_EQ(device.memory_info(&info), Status::ok);
  return info.free_bytes;
}

TEST(CachingAllocatorBudget, ReservedNeverExceedsTheBudget) {
  constexpr std::size_t kCapacity = 256 * MiB;
  constexpr std::size_t kBudget = 40 * MiB;
  SimDevice device(sim_options(kCapacity));
  CachingAllocator allocator(device, allocator_options(kBudget, 8 * MiB));
  std::mt19937_64 rng(7);
  std::vector<void*> live;
  int failures = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const std::size_t classes[] = {1 + rng() % (64 * KiB), 1 * MiB + rng() % (6 * MiB),
                                     9 * MiB + rng() % (16 * MiB)};
      void* ptr = nullptr;
      const Status status = allocator.allocate(&ptr, classes[rng() % 3], {});
      if (status == Status::ok) {
        live.push_back(ptr);
      } else {
        ASSERT_EQ(status, Status::out_of_memory);
        ASSERT_EQ(ptr, nullptr);
        ++failures;
      }
    } else {
      const std::size_t victim = rng() % live.size();
      ASSERT_EQ(allocator.deallocate(live[victim]), Status::ok);
      live[victim] = live.back();
      live.pop_back();
    }
    const Stats stats = allocator.stats();
    ASSERT_LE(stats.reserved_bytes.current, static_cast<std::int64_t>(kBudget));
    ASSERT_EQ(device.used_bytes(), static_cast<std::size_t>(stats.reserved_bytes.current));
    ASSERT_EQ(device_free_bytes(device), kCapacity - device.used_bytes());
  }
  EXPECT_GT(failures, 0) << "the budget was never reached; the test proves nothing";
  EXPECT_LE(allocator.stats().reserved_bytes.peak, static_cast<std::int64_t>(kBudget));
  EXPECT_EQ(allocator.stats().num_ooms, failures);
  for (void* ptr : live) ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
}

TEST(CachingAllocatorBudget, LargeRequestNearTheBudgetGetsASegmentJustBigEnough) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(12 * MiB, 8 * MiB));
  void* a = allocate_ok(allocator, 6 * MiB);  // one 8 MiB slab, 2 MiB left in it
  void* b = allocate_ok(allocator, 3 * MiB);  // a full slab would pass the budget
  EXPECT_EQ(device.allocation_size(b), 4 * MiB);
  EXPECT_EQ(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(12 * MiB));
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  (void)a;
}

TEST(CachingAllocatorBudget, DeviceShortOfAWholeSlabGivesASegmentJustBigEnough) {
  SimDevice device(sim_options(10 * MiB));
  CachingAllocator allocator(device, allocator_options(1024 * MiB, 8 * MiB));
  void* chunk = allocate_ok(allocator, 8 * MiB);
  void* b = allocate_ok(allocator, 1 * MiB + 512 * KiB);  // 2 MiB left on the device
  EXPECT_EQ(device.allocation_size(b), 2 * MiB);
  EXPECT_EQ(allocator.stats().num_alloc_retries, 0);
  ASSERT_EQ(allocator.deallocate(b), Status::ok);
  ASSERT_EQ(allocator.deallocate(chunk), Status::ok);
}

TEST(CachingAllocatorBudget, LoweringTheBudgetReturnsCachedSegments) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB));
  void* kept = allocate_ok(allocator, 4 * KiB);
  ASSERT_EQ(allocator.deallocate(allocate_ok(allocator, 20 * MiB)), Status::ok);
  EXPECT_EQ(device.used_bytes(), 22 * MiB);
  allocator.set_budget_bytes(8 * MiB);
  EXPECT_EQ(allocator.budget_bytes(), 8 * MiB);
  EXPECT_EQ(device.used_bytes(), 2 * MiB);
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate(&ptr, 7 * MiB, {}), Status::out_of_memory);
  ASSERT_EQ(allocator.deallocate(kept), Status::ok);
}

TEST(CachingAllocatorOutOfMemory, MessageSaysWhoHoldsWhatAndTheAllocatorKeepsServing) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(8 * MiB, 8 * MiB));
  BlockHolder holder(allocator, "test holder");
  allocator.add_pressure_handler(&holder);
  void* a = allocate_ok(allocator, 6 * MiB);  // 2 MiB left free in the slab

  void* b = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(allocator.allocate(&b, 4 * MiB, {}), Status::out_of_memory);
  EXPECT_EQ(b, nullptr);
  const std::string message = CachingAllocator::last_error();
  EXPECT_THAT(message, HasSubstr("out of memory"));
  EXPECT_THAT(message, HasSubstr("asked 4.00 MiB (4194304 bytes"));
  EXPECT_THAT(message, HasSubstr("default stream"));
  EXPECT_THAT(message, HasSubstr("budget 8.00 MiB"));
  EXPECT_THAT(message, HasSubstr("reserved 8.00 MiB"));
  EXPECT_THAT(message, HasSubstr("allocated 6.00 MiB"));
  EXPECT_THAT(message, HasSubstr("cached 2.00 MiB"));
  EXPECT_THAT(message, HasSubstr("largest free block 2.00 MiB"));
  EXPECT_THAT(message, HasSubstr("test holder: 0 blocks"));
  EXPECT_EQ(holder.calls, 1);  // asked before giving up

  Stats stats = allocator.stats();
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<std::int64_t>(8 * MiB));

  // Free, then the same request succeeds in the same slab.
  ASSERT_EQ(allocator.deallocate(a), Status::ok);
  void* c = allocate_ok(allocator, 4 * MiB);
  EXPECT_EQ(c, a);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  ASSERT_EQ(allocator.deallocate(c), Status::ok);
  allocator.remove_pressure_handler(&holder);
}

TEST(CachingAllocatorOutOfMemory, RequestLargerThanTheBudgetFailsWithoutFreeingAnything) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(16 * MiB));
  BlockHolder holder(allocator, "holder");
  allocator.add_pressure_handler(&holder);
  ASSERT_EQ(allocator.deallocate(allocate_ok(allocator, 4 * KiB)), Status::ok);
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate(&ptr, 17 * MiB, {}), Status::out_of_memory);
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("larger than the whole budget"));
  EXPECT_EQ(holder.calls, 0);
  EXPECT_EQ(device.used_bytes(), 2 * MiB);  // the cache was left alone
  EXPECT_EQ(allocator.stats().num_ooms, 1);
  EXPECT_EQ(allocator.allocate(&ptr, ~std::size_t{0}, {}), Status::out_of_memory);
  EXPECT_EQ(allocator.stats().num_ooms, 2);
  allocator.remove_pressure_handler(&holder);
}

TEST(CachingAllocatorOutOfMemory, CachedSegmentsOfOtherStreamsAreReleasedBeforeFailing) {
  SimDevice device(sim_options(256 * MiB));
  Stream s1, s2;
  ASSERT_EQ(device.create_stream(&s1), Status::ok);
  ASSERT_EQ(device.create_stream(&s2), Status::ok);
  CachingAllocator allocator(device, allocator_options(16 * MiB, 8 * MiB));
  void* a = allocate_ok(allocator, 8 * MiB, s1);
  void* b = allocate_ok(allocator, 8 * MiB, s1);
  ASSERT_EQ(allocator.deallocate(a), Status::ok);
  ASSERT_EQ(allocator.deallocate(b), Status::ok);
  // Both slabs are cached for s1; s2 can only get memory by releasing them.
  void* c = allocate_ok(allocator, 12 * MiB, s2);
  EXPECT_EQ(allocator.stats().num_alloc_retries, 1);
  EXPECT_EQ(allocator.stats().num_device_free, 2);
  EXPECT_EQ(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(12 * MiB));
  ASSERT_EQ(allocator.deallocate(c), Status::ok);
}

TEST(CachingAllocatorDeviceFailure, InjectedMallocFaultIsRetried) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB));
  device.fail_nth_malloc(1);
  void* ptr = allocate_ok(allocator, 4 * KiB);
  const Stats stats = allocator.stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_device_alloc, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
}

TEST(CachingAllocatorDeviceFailure, PersistentFaultsEndInAnOutOfMemoryThatNamesTheDevice) {
  SimDevice sim(sim_options(256 * MiB));
  CountingDevice device(sim);
  CachingAllocator allocator(device, allocator_options(64 * MiB));
  void* held = allocate_ok(allocator, 4 * KiB);
  device.fail_mallocs_with(Status::injected_fault);
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate(&ptr, 2 * MiB, {}), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("device refused a new segment"));
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("injected fault"));
  // Cached blocks still serve while the device refuses.
  void* cached = allocate_ok(allocator, 4 * KiB);
  ASSERT_EQ(allocator.deallocate(cached), Status::ok);

  device.fail_mallocs_with(Status::error);  // not a shortage: the device's own error
  EXPECT_EQ(allocator.allocate(&ptr, 2 * MiB, {}), Status::error);
  EXPECT_EQ(allocator.stats().num_ooms, 2);

  device.fail_mallocs_with(Status::ok);
  ASSERT_EQ(allocator.deallocate(allocate_ok(allocator, 2 * MiB)), Status::ok);
  ASSERT_EQ(allocator.deallocate(held), Status::ok);
  allocator.empty_cache();
  EXPECT_EQ(sim.used_bytes(), 0u);
}

TEST(CachingAllocatorDeviceFailure, DeviceOutOfMemoryReleasesCacheAndRetries) {
  // Budget above capacity: the device, not the budget, is the limit.
  SimDevice device(sim_options(16 * MiB));
  Stream s1, s2;
  ASSERT_EQ(device.create_stream(&s1), Status::ok);
  ASSERT_EQ(device.create_stream(&s2), Status::ok);
  CachingAllocator allocator(device, allocator_options(1024 * MiB, 8 * MiB));
  void* a = allocate_ok(allocator, 8 * MiB, s1);
  void* b = allocate_ok(allocator, 8 * MiB, s1);
  ASSERT_EQ(allocator.deallocate(a), Status::ok);
  void* c = allocate_ok(allocator, 8 * MiB, s2);  // the device is full until a's slab goes
  EXPECT_EQ(allocator.stats().num_alloc_retries, 1);
  void* d = nullptr;
  EXPECT_EQ(allocator.allocate(&d, 8 * MiB, s2), Status::out_of_memory);
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("device refused"));
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("out of memory (malloc of"));
  ASSERT_EQ(allocator.deallocate(b), Status::ok);
  ASSERT_EQ(allocator.deallocate(c), Status::ok);
  EXPECT_EQ(allocator.stats().allocated_bytes.current, 0);
  EXPECT_EQ(device.used_bytes(),
            static_cast<std::size_t>(allocator.stats().reserved_bytes.current));
}

TEST(CachingAllocatorPressureHandlers, HandlerFreesBlocksAndTheRetrySucceeds) {
  SimDevice device(sim_options(256 * MiB));
  Stream compute, copy;
  ASSERT_EQ(device.create_stream(&compute), Status::ok);
  ASSERT_EQ(device.create_stream(&copy), Status::ok);
  CachingAllocator allocator(device, allocator_options(16 * MiB, 8 * MiB));
  BlockHolder idle(allocator, "idle handler");  // holds nothing
  BlockHolder chunks(allocator, "chunks");
  allocator.add_pressure_handler(&idle);
  allocator.add_pressure_handler(&chunks);
  // "Chunks" fill the budget, on their own stream.
  chunks.hold(allocate_ok(allocator, 8 * MiB, copy), 8 * MiB);
  chunks.hold(allocate_ok(allocator, 8 * MiB, copy), 8 * MiB);

  void* activation = allocate_ok(allocator, 3 * MiB, compute);
  EXPECT_EQ(idle.calls, 1);
  EXPECT_EQ(chunks.calls, 1);
  EXPECT_EQ(chunks.last_bytes, 3 * MiB);
  EXPECT_EQ(chunks.last_stream, compute);
  EXPECT_EQ(chunks.stats_seen_in_handler, 2);
  const Stats stats = allocator.stats();
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<std::int64_t>(8 * MiB + 3 * MiB));
  EXPECT_LE(stats.reserved_bytes.current, static_cast<std::int64_t>(16 * MiB));
  EXPECT_EQ(device.allocation_size(activation), 8 * MiB);
  ASSERT_EQ(allocator.deallocate(activation), Status::ok);
  allocator.remove_pressure_handler(&idle);
  allocator.remove_pressure_handler(&chunks);
}

// Note [Asking a handler until the request fits]: the first block the
// handler frees leaves its slab half full, on the handler's stream, so the
// request on another stream fits only after a second round empties the slab.
TEST(CachingAllocatorPressureHandlers, HandlerIsAskedAgainUntilWhatItFreesMakesRoom) {
  SimDevice device(sim_options(256 * MiB));
  Stream compute, copy;
  ASSERT_EQ(device.create_stream(&compute), Status::ok);
  ASSERT_EQ(device.create_stream(&copy), Status::ok);
  CachingAllocator allocator(device, allocator_options(16 * MiB, 8 * MiB));
  BlockHolder chunks(allocator, "chunks");
  allocator.add_pressure_handler(&chunks);
  // Two 8 MiB slabs, two "chunks" in each, fill the budget.
  for (int i = 0; i < 4; ++i) chunks.hold(allocate_ok(allocator, 4 * MiB, copy), 4 * MiB);
  ASSERT_EQ(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(16 * MiB));

  void* activation = allocate_ok(allocator, 3 * MiB, compute);
  EXPECT_EQ(chunks.calls, 2);
  const Stats stats = allocator.stats();
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.num_spills_for_allocation, 1);
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<std::int64_t>(8 * MiB + 3 * MiB));
  EXPECT_LE(stats.reserved_bytes.current, static_cast<std::int64_t>(16 * MiB));
  ASSERT_EQ(allocator.deallocate(activation), Status::ok);
  allocator.remove_pressure_handler(&chunks);
}

TEST(CachingAllocatorPressureHandlers, HandlerThatFreesNothingLeadsToOutOfMemory) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(8 * MiB, 8 * MiB));
  BlockHolder holder(allocator, "stubborn holder");
  allocator.add_pressure_handler(&holder);
  void* a = allocate_ok(allocator, 8 * MiB);
  void* b = nullptr;
  EXPECT_EQ(allocator.allocate(&b, 4 * KiB, {}), Status::out_of_memory);
  EXPECT_EQ(holder.calls, 1);
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("stubborn holder: 0 blocks"));
  allocator.remove_pressure_handler(&holder);
  // Removed handlers are not asked.
  EXPECT_EQ(allocator.allocate(&b, 4 * KiB, {}), Status::out_of_memory);
  EXPECT_EQ(holder.calls, 1);
  EXPECT_THAT(CachingAllocator::last_error(), HasSubstr("no pressure handlers"));
  ASSERT_EQ(allocator.deallocate(a), Status::ok);
}

}  // namespace
}  // namespace spillway::testing
