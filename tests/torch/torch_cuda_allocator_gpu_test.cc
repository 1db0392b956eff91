// spillway as torch's CUDA allocator on a GPU (use_as_torch_cuda_allocator):
// torch's own entry points (c10::cuda::CUDACachingAllocator, behind
// torch.cuda.memory_stats, reset_peak_memory_stats, empty_cache and
// Tensor.record_stream) answer from spillway, a 0-element tensor allocates,
// and a tensor over the budget throws c10::OutOfMemoryError, after which
// allocation goes on; c10's allocator registry names spillway's allocator.
// Label gpu: skips where no GPU is usable. Its own program: torch's allocator
// is swapped once, before its first allocation. The same logic over a
// simulated device: torch_cuda_allocator_test.cc.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "hooks/torch/spillway_torch.h"

namespace {

namespace allocator = c10::cuda::CUDACachingAllocator;
constexpr std::size_t kAll = 0;  // torch's StatType::AGGREGATE
constexpr std::int64_t kMiB = std::int64_t{1} << 20;

std::int64_t spillway_figure(const char* key) {
  return nlohmann::json::parse(spillway::memory_stats_json()).at(key).get<std::int64_t>();
}

torch::Tensor cuda_bytes(std::int64_t bytes) {
  return torch::empty({bytes}, torch::dtype(torch::kUInt8).device(torch::kCUDA));
}

class TorchCudaAllocatorOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable GPU (torch::cuda::is_available)";
    static const bool installed = [] {
      spillway::configure("device:cuda,device_budget:256MiB,chunk_size:16MiB");
      spillway::use_as_torch_cuda_allocator();
      return true;
    }();
    ASSERT_TRUE(installed);
  }
};

TEST_F(TorchCudaAllocatorOnGpu, MemoryStatsAreSpillways) {
  const torch::Tensor held = cuda_bytes(4 * kMiB);
  const auto stats = allocator::getDeviceStats(0);
  EXPECT_GE(stats.allocated_bytes[kAll].current, 4 * kMiB);
  EXPECT_EQ(stats.allocated_bytes[kAll].current, spillway_figure("allocated_bytes.all.current"));
  EXPECT_EQ(stats.reserved_bytes[kAll].current, spillway_figure("reserved_bytes.all.current"));
}

// Note [torch's two CUDA allocator slots] (torch_cuda_allocator.cc): code
// that allocates through c10's registry gets spillway's memory too.
TEST_F(TorchCudaAllocatorOnGpu, C10RegistrySlotIsSpillways) {
  ASSERT_EQ(c10::GetAllocator(c10::DeviceType::CUDA), allocator::get());
  const std::int64_t before = spillway_figure("allocated_bytes.all.current");
  {
    const c10::DataPtr held = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(2 * kMiB);
    ASSERT_NE(held.get(), nullptr);
    EXPECT_EQ(spillway_figure("allocated_bytes.all.current"), before + 2 * kMiB);
  }
  EXPECT_EQ(spillway_figure("allocated_bytes.all.current"), before);
}

TEST_F(TorchCudaAllocatorOnGpu, ResetPeakAndEmptyCache) {
  std::int64_t reserved_while_held = 0;
  {
    const torch::Tensor big = cuda_bytes(32 * kMiB).fill_(1);
    torch::cuda::synchronize();
    reserved_while_held = allocator::getDeviceStats(0).reserved_bytes[kAll].current;
  }
  auto stats = allocator::getDeviceStats(0);
  ASSERT_GE(stats.allocated_bytes[kAll].peak, 32 * kMiB);
  allocator::resetPeakStats(0);
  stats = allocator::getDeviceStats(0);
  EXPECT_EQ(stats.allocated_bytes[kAll].peak, stats.allocated_bytes[kAll].current);
  allocator::emptyCache();
  EXPECT_LE(allocator::getDeviceStats(0).reserved_bytes[kAll].current,
            reserved_while_held - 32 * kMiB);
}

TEST_F(TorchCudaAllocatorOnGpu, RecordStreamIsAccepted) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  torch::Tensor shared = cuda_bytes(kMiB);
  EXPECT_NO_THROW(shared.record_stream(side));
  shared = torch::Tensor();
  side.synchronize();
}

TEST_F(TorchCudaAllocatorOnGpu, EmptyTensorAllocates) {
  const torch::Tensor empty = cuda_bytes(0);
  EXPECT_EQ(empty.numel(), 0);
}

TEST_F(TorchCudaAllocatorOnGpu, OverTheBudgetIsTorchsOutOfMemoryError) {
  const std::int64_t ooms = allocator::getDeviceStats(0).num_ooms;
  try {
    cuda_bytes(512 * kMiB);
    FAIL() << "512 MiB under a 256 MiB budget was allocated";
  } catch (const c10::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("spillway: CUDA out of memory"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(allocator::getDeviceStats(0).num_ooms, ooms + 1);
  EXPECT_EQ(cuda_bytes(kMiB).fill_(7).sum().item<std::int64_t>(), 7 * kMiB);
}

}  // namespace
