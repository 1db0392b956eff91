// Whose bytes a block holds (allocated_bytes.model / .non_model), what counts
// as an out-of-memory (only a failure returned to a caller), allocations that
// fit only because a pressure handler spilled (num_spills_for_allocation),
// and segments past the budget (Note [Segments past the budget]).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/caching/pressure_handler.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

// Holds model blocks and frees them all when asked, as the chunk manager
// spills chunks.
class SpillingHolder final : public PressureHandler {
 public:
  explicit SpillingHolder(CachingAllocator& allocator) : allocator_(allocator) {}
  void hold(void* ptr, std::size_t bytes) { held_.push_back({ptr, bytes}); }
  std::size_t relieve_pressure(std::size_t, Stream) override {
    std::size_t freed = 0;
    for (const auto& [ptr, bytes] : held_) {
      EXPECT_EQ(allocator_.deallocate(ptr), Status::ok);
      freed += bytes;
    }
    held_.clear();
    return freed;
  }
  std::string describe_holdings() const override { return "spilling holder"; }

 private:
  CachingAllocator& allocator_;
  std::vector<std::pair<void*, std::size_t>> held_;
};

void* allocate_model(CachingAllocator& allocator, std::size_t bytes) {
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate(&ptr, bytes, {}, AllocationOwner::model), Status::ok)
      << CachingAllocator::last_error();
  return ptr;
}

TEST(CachingAllocatorOwners, AllocatedBytesSplitIntoModelAndNonModel) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB, 8 * MiB));
  void* chunk = allocate_model(allocator, 8 * MiB);
  void* activation = allocate_ok(allocator, 3 * MiB);
  void* small = allocate_ok(allocator, 1000);  // rounded to 1024
  Stats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes_model.current, static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(stats.allocated_bytes_non_model.current, static_cast<std::int64_t>(3 * MiB + 1024));
  EXPECT_EQ(stats.allocated_bytes_model.current + stats.allocated_bytes_non_model.current,
            stats.allocated_bytes.current);
  ASSERT_EQ(allocator.deallocate(chunk), Status::ok);
  ASSERT_EQ(allocator.deallocate(activation), Status::ok);
  stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes_model.current, 0);
  EXPECT_EQ(stats.allocated_bytes_model.peak, static_cast<std::int64_t>(8 * MiB));
  EXPECT_EQ(stats.allocated_bytes_non_model.current, 1024);
  EXPECT_EQ(stats.allocated_bytes_non_model.peak, static_cast<std::int64_t>(3 * MiB + 1024));
  // A block's owner is its own: the non-model block reusing the freed model
  // block's memory counts as non-model.
  void* reused = allocate_ok(allocator, 8 * MiB);
  EXPECT_EQ(allocator.stats().allocated_bytes_model.current, 0);
  ASSERT_EQ(allocator.deallocate(reused), Status::ok);
  ASSERT_EQ(allocator.deallocate(small), Status::ok);

  // The flat keys are the contract's.
  std::vector<std::string> keys;
  for (const auto& [key, value] : allocator.stats().flatten()) keys.push_back(key);
  EXPECT_THAT(keys, ::testing::IsSupersetOf(
                        {"allocated_bytes.model.current", "allocated_bytes.model.peak",
                         "allocated_bytes.non_model.current", "allocated_bytes.non_model.peak",
                         "num_spills_for_allocation", "num_budget_overruns", "min_budget_bytes"}));
}

// Note [Room a prefetch takes early] (planned_policy.h): the most non-model
// bytes since the last take, model blocks aside; each take starts the next
// mark at the bytes allocated then.
TEST(CachingAllocatorOwners, TheNonModelHighWaterMarkIsTheMostSinceTheLastTake) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB, 8 * MiB));
  EXPECT_EQ(allocator.take_non_model_high_water(), 0u);
  void* chunk = allocate_model(allocator, 8 * MiB);
  void* kept = allocate_ok(allocator, 1 * MiB);
  void* peak = allocate_ok(allocator, 3 * MiB);
  ASSERT_EQ(allocator.deallocate(peak), Status::ok);
  EXPECT_EQ(allocator.take_non_model_high_water(), 4 * MiB) << "the freed block counted";
  EXPECT_EQ(allocator.take_non_model_high_water(), 1 * MiB) << "from the bytes at the take";
  ASSERT_EQ(allocator.deallocate(chunk), Status::ok);
  ASSERT_EQ(allocator.deallocate(kept), Status::ok);
  EXPECT_EQ(allocator.take_non_model_high_water(), 1 * MiB) << "freed after the take";
  EXPECT_EQ(allocator.take_non_model_high_water(), 0u);
}

TEST(CachingAllocatorOwners, OnlyAFailureReturnedToACallerIsAnOutOfMemory) {
  SimDevice device(sim_options(256 * MiB));
  RecordingTraceSink trace;
  CachingAllocator allocator(device, allocator_options(8 * MiB, 8 * MiB), &trace);
  void* full = allocate_ok(allocator, 8 * MiB);
  void* ptr = nullptr;
  // The chunk manager's request: it evicts and tries again, so not an OOM.
  EXPECT_EQ(allocator.allocate(&ptr, 8 * MiB, {}, AllocationOwner::model), Status::out_of_memory);
  EXPECT_THAT(CachingAllocator::last_error(), ::testing::HasSubstr("budget"));
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  EXPECT_TRUE(trace.of_kind(TraceEventKind::oom).empty());
  // A caller's request that fails is one.
  EXPECT_EQ(allocator.allocate(&ptr, 8 * MiB, {}), Status::out_of_memory);
  EXPECT_EQ(allocator.stats().num_ooms, 1);
  EXPECT_EQ(trace.of_kind(TraceEventKind::oom).size(), 1u);
  ASSERT_EQ(allocator.deallocate(full), Status::ok);
}

TEST(CachingAllocatorOwners, AnAllocationThatFitsOnlyAfterASpillIsCounted) {
  SimDevice device(sim_options(256 * MiB));
  RecordingTraceSink trace;
  CachingAllocator allocator(device, allocator_options(16 * MiB, 8 * MiB), &trace);
  SpillingHolder chunks(allocator);
  allocator.add_pressure_handler(&chunks);
  chunks.hold(allocate_model(allocator, 8 * MiB), 8 * MiB);
  void* fits = allocate_ok(allocator, 8 * MiB);  // within the budget: no spill
  EXPECT_EQ(allocator.stats().num_spills_for_allocation, 0);
  void* spilled_for = allocate_ok(allocator, 6 * MiB);
  const Stats stats = allocator.stats();
  EXPECT_EQ(stats.num_spills_for_allocation, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.allocated_bytes_model.current, 0);
  const std::vector<TraceEvent> spills = trace.of_kind(TraceEventKind::spill_for_allocation);
  ASSERT_EQ(spills.size(), 1u);
  EXPECT_EQ(spills[0].size, 6 * MiB);
  EXPECT_EQ(spills[0].address, reinterpret_cast<std::uint64_t>(spilled_for));
  allocator.remove_pressure_handler(&chunks);
  ASSERT_EQ(allocator.deallocate(fits), Status::ok);
  ASSERT_EQ(allocator.deallocate(spilled_for), Status::ok);
}

TEST(CachingAllocatorOverrun, ASegmentPastTheBudgetIsGivenBackAtItsFree) {
  SimDevice device(sim_options(256 * MiB));
  CachingAllocator allocator(device, allocator_options(8 * MiB, 8 * MiB));
  void* resident = allocate_model(allocator, 8 * MiB);
  void* ptr = nullptr;
  ASSERT_EQ(allocator.allocate(&ptr, 2 * MiB, {}, AllocationOwner::model), Status::out_of_memory);
  ASSERT_EQ(allocator.allocate_over_budget(&ptr, 2 * MiB, {}), Status::ok)
      << CachingAllocator::last_error();
  ASSERT_NE(ptr, nullptr);
  Stats stats = allocator.stats();
  // Just big enough (2 MiB), not a whole slab.
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(stats.allocated_bytes_model.current, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(stats.num_ooms, 0);
  ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
  // The free ends the overrun: reserved is back within the budget.
  EXPECT_LE(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(8 * MiB));
  // Within the budget it takes a cached block, past nothing.
  ASSERT_EQ(allocator.deallocate(resident), Status::ok);
  ASSERT_EQ(allocator.allocate_over_budget(&ptr, 2 * MiB, {}), Status::ok);
  EXPECT_LE(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(8 * MiB));
  ASSERT_EQ(allocator.deallocate(ptr), Status::ok);
}

TEST(CachingAllocatorOverrun, FailsOnlyWhenTheDeviceItselfIsFull) {
  SimDevice device(sim_options(9 * MiB));
  CachingAllocator allocator(device, allocator_options(8 * MiB, 8 * MiB));
  void* resident = allocate_model(allocator, 8 * MiB);
  void* ptr = nullptr;
  EXPECT_EQ(allocator.allocate_over_budget(&ptr, 2 * MiB, {}), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_THAT(CachingAllocator::last_error(), ::testing::HasSubstr("past the budget"));
  EXPECT_EQ(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(8 * MiB));
  ASSERT_EQ(allocator.deallocate(resident), Status::ok);
}

}  // namespace
}  // namespace spillway::testing
