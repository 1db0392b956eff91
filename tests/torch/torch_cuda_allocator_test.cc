// TorchCudaAllocator (hooks/torch/torch_cuda_allocator.h), the object torch
// gets as its CUDA allocator, driven over a simulated device: everything it
// does that needs no GPU. torch's figures equal spillway's (memory_stats and
// the functions that read it), a 0-byte request gives no memory and no error,
// a request that cannot fit throws c10::OutOfMemoryError with the caching
// allocator's message, and empty_cache / record_stream reach the allocator.
// Installing it and torch's allocate() need a GPU:
// torch_cuda_allocator_gpu_test.cc.
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "allocator/caching/caching_allocator.h"
#include "allocator/config/format_bytes.h"
#include "allocator/device/sim_device.h"
#include "hooks/torch/torch_cuda_allocator.h"
#include "hooks/torch/torch_device_stats.h"

namespace spillway {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kAll = 0, kSmallPool = 1, kLargePool = 2;  // torch's StatType

StatArray stat(std::int64_t base) { return {base, base + 1, base + 2, base + 3}; }

template <typename TorchStatArray>
void expect_aggregate(const TorchStatArray& torch_stat, const StatArray& ours, const char* name) {
  EXPECT_EQ(torch_stat[kAll].current, ours.current) << name;
  EXPECT_EQ(torch_stat[kAll].peak, ours.peak) << name;
  EXPECT_EQ(torch_stat[kAll].allocated, ours.allocated) << name;
  EXPECT_EQ(torch_stat[kAll].freed, ours.freed) << name;
  for (std::size_t pool : {kSmallPool, kLargePool}) {
    EXPECT_EQ(torch_stat[pool].current, 0) << name;
    EXPECT_EQ(torch_stat[pool].allocated, 0) << name;
  }
}

TEST(TorchDeviceStats, CarriesEachKeptFigureInTheAllEntry) {
  Stats stats;
  stats.allocation = stat(10);
  stats.segment = stat(20);
  stats.allocated_bytes = stat(30);
  stats.reserved_bytes = stat(40);
  stats.active_bytes = stat(50);
  stats.num_alloc_retries = 61;
  stats.num_ooms = 62;
  stats.num_device_alloc = 63;
  stats.num_device_free = 64;
  stats.evictions = 70;  // spillway's own figures have no torch field

  const auto torch_stats = to_torch_device_stats(stats);
  expect_aggregate(torch_stats.allocation, stats.allocation, "allocation");
  expect_aggregate(torch_stats.segment, stats.segment, "segment");
  expect_aggregate(torch_stats.allocated_bytes, stats.allocated_bytes, "allocated_bytes");
  expect_aggregate(torch_stats.reserved_bytes, stats.reserved_bytes, "reserved_bytes");
  expect_aggregate(torch_stats.active_bytes, stats.active_bytes, "active_bytes");
  EXPECT_EQ(torch_stats.num_alloc_retries, 61);
  EXPECT_EQ(torch_stats.num_ooms, 62);
  EXPECT_EQ(torch_stats.num_device_alloc, 63);
  EXPECT_EQ(torch_stats.num_device_free, 64);
  // Not kept by spillway: 0 (Note [torch's figures from spillway's]).
  EXPECT_EQ(torch_stats.requested_bytes[kAll].current, 0);
  EXPECT_EQ(torch_stats.inactive_split_bytes[kAll].current, 0);
}

// An 8 MiB budget on a simulated device, with no pressure handler: nothing
// can be spilled, so a request over the budget is out of memory.
class TorchCudaAllocatorOnSim : public ::testing::Test {
 protected:
  TorchCudaAllocatorOnSim()
      : device_(SimDeviceOptions{.capacity_bytes = 64 * kMiB}),
        allocator_(device_,
                   CachingAllocatorOptions{.budget_bytes = 8 * kMiB, .large_slab_bytes = 4 * kMiB}),
        torch_allocator_(allocator_, /*device_ordinal=*/0) {}

  SimDevice device_;
  CachingAllocator allocator_;
  TorchCudaAllocator torch_allocator_;
};

TEST_F(TorchCudaAllocatorOnSim, ZeroBytesGiveNoMemoryAndNoError) {
  EXPECT_EQ(torch_allocator_.malloc(0, 0, nullptr), nullptr);
  EXPECT_NO_THROW(torch_allocator_.raw_delete(nullptr));
  EXPECT_EQ(allocator_.stats().allocation.allocated, 0);
  EXPECT_EQ(allocator_.stats().num_ooms, 0);
}

TEST_F(TorchCudaAllocatorOnSim, TorchsFiguresAreSpillways) {
  void* ptr = torch_allocator_.malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(ptr, nullptr);
  auto torch_stats = torch_allocator_.getDeviceStats(0);
  EXPECT_EQ(torch_stats.allocated_bytes[kAll].current, allocator_.stats().allocated_bytes.current);
  EXPECT_GE(torch_stats.allocated_bytes[kAll].current, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_EQ(torch_stats.reserved_bytes[kAll].current, allocator_.stats().reserved_bytes.current);
  EXPECT_EQ(torch_stats.allocation[kAll].current, 1);
  // spillway allocates on its one device only.
  EXPECT_EQ(torch_allocator_.getDeviceStats(1).allocated_bytes[kAll].current, 0);

  torch_allocator_.raw_delete(ptr);
  torch_stats = torch_allocator_.getDeviceStats(0);
  EXPECT_EQ(torch_stats.allocated_bytes[kAll].current, 0);
  EXPECT_GE(torch_stats.allocated_bytes[kAll].peak, static_cast<std::int64_t>(3 * kMiB));

  // torch.cuda.reset_peak_memory_stats()
  torch_allocator_.resetPeakStats(0);
  EXPECT_EQ(torch_allocator_.getDeviceStats(0).allocated_bytes[kAll].peak, 0);
}

TEST_F(TorchCudaAllocatorOnSim, EmptyCacheReturnsTheFreeSlabs) {
  torch_allocator_.raw_delete(torch_allocator_.malloc(3 * kMiB, 0, nullptr));
  ASSERT_GT(torch_allocator_.getDeviceStats(0).reserved_bytes[kAll].current, 0);
  torch_allocator_.emptyCache();  // torch.cuda.empty_cache()
  EXPECT_EQ(torch_allocator_.getDeviceStats(0).reserved_bytes[kAll].current, 0);
}

TEST_F(TorchCudaAllocatorOnSim, OutOfMemoryThrowsTorchsErrorWithSpillwaysFigures) {
  // 6 MiB would fit the budget, but not beside the slab the held block is in.
  void* held = torch_allocator_.malloc(3 * kMiB, 0, nullptr);
  const Stats before = allocator_.stats();
  try {
    torch_allocator_.malloc(6 * kMiB, 0, nullptr);
    FAIL() << "a request over what is left of the budget returned";
  } catch (const c10::OutOfMemoryError& error) {
    const std::string message = error.what();
    for (const std::string& part :
         {std::string("spillway: CUDA out of memory"), std::string("asked 6.00 MiB"),
          std::string("budget 8.00 MiB"), "reserved " + format_bytes(before.reserved_bytes.current),
          "allocated " + format_bytes(before.allocated_bytes.current),
          std::string("largest free block"), std::string("no pressure handlers")})
      EXPECT_NE(message.find(part), std::string::npos) << "no '" << part << "' in: " << message;
  }
  EXPECT_EQ(torch_allocator_.getDeviceStats(0).num_ooms, 1);
  // Nothing was lost: the held block is intact and what fits still allocates.
  EXPECT_EQ(allocator_.stats().allocated_bytes.current, before.allocated_bytes.current);
  void* next = torch_allocator_.malloc(2 * kMiB, 0, nullptr);
  EXPECT_NE(next, nullptr);
  torch_allocator_.raw_delete(next);
  torch_allocator_.raw_delete(held);
  EXPECT_EQ(allocator_.stats().allocated_bytes.current, 0);
}

TEST_F(TorchCudaAllocatorOnSim, AnotherDeviceIsAnErrorButNotOutOfMemory) {
  try {
    torch_allocator_.malloc(kMiB, 1, nullptr);
    FAIL() << "device 1 was served";
  } catch (const c10::OutOfMemoryError& error) {
    FAIL() << "reported as out of memory: " << error.what();
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("manages CUDA device 0 only"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(allocator_.stats().num_ooms, 0);
}

TEST_F(TorchCudaAllocatorOnSim, RecordStreamReachesTheAllocator) {
  Stream side;
  ASSERT_EQ(device_.create_stream(&side), Status::ok);
  const auto side_stream =
      c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(side.handle), 0);
  void* ptr = torch_allocator_.malloc(kMiB, 0, nullptr);
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  EXPECT_NO_THROW(torch_allocator_.recordStream(c10::DataPtr(ptr, cuda), side_stream));
  torch_allocator_.raw_delete(ptr);
  // A pointer spillway did not hand out is an error, never skipped.
  int not_ours = 0;
  EXPECT_THROW(torch_allocator_.recordStream(c10::DataPtr(&not_ours, cuda), side_stream),
               c10::Error);
  ASSERT_EQ(device_.synchronize_stream(side), Status::ok);
  ASSERT_EQ(device_.destroy_stream(side), Status::ok);
}

}  // namespace
}  // namespace spillway
