// SimDevice's own behaviour beyond the conformance suite: capacity, fault
// injection, poison-on-free, bounds checks and the injected copy delay.
#include "allocator/device/sim_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace spillway {
namespace {

TEST(SimDevice, CapacityIsEnforcedAndFreedBytesCountAgain) {
  SimDevice device(SimDeviceOptions{.capacity_bytes = 1 << 20});
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(device.malloc(&a, 768 << 10), Status::ok);
  EXPECT_EQ(device.malloc(&b, 512 << 10), Status::out_of_memory);
  EXPECT_EQ(b, nullptr);
  EXPECT_NE(device.last_error().find("bytes free"), std::string::npos) << device.last_error();
  EXPECT_EQ(device.used_bytes(), std::size_t{768} << 10);
  ASSERT_EQ(device.free(a), Status::ok);
  EXPECT_EQ(device.used_bytes(), 0u);
  ASSERT_EQ(device.malloc(&b, 1 << 20), Status::ok);
  EXPECT_EQ(device.free(b), Status::ok);
}

TEST(SimDevice, SizesRoundUpTo256Bytes) {
  SimDevice device;
  void* ptr = nullptr;
  ASSERT_EQ(device.malloc(&ptr, 1), Status::ok);
  EXPECT_EQ(device.allocation_size(ptr), 256u);
  EXPECT_EQ(device.used_bytes(), 256u);
  EXPECT_EQ(device.free(ptr), Status::ok);
}

TEST(SimDevice, FailsTheNthMalloc) {
  SimDevice device;
  device.fail_nth_malloc(3);
  std::vector<void*> blocks;
  std::vector<Status> results;
  for (int i = 0; i < 5; ++i) {
    void* ptr = nullptr;
    results.push_back(device.malloc(&ptr, 1024));
    if (ptr) blocks.push_back(ptr);
  }
  EXPECT_EQ(results, (std::vector<Status>{Status::ok, Status::ok, Status::injected_fault,
                                          Status::ok, Status::ok}));
  for (void* ptr : blocks) EXPECT_EQ(device.free(ptr), Status::ok);
}

TEST(SimDevice, FailsTheNthHostMallocOnly) {
  SimDevice device;
  device.fail_nth_host_malloc(1);
  void* device_ptr = nullptr;
  void* host_ptr = nullptr;
  ASSERT_EQ(device.malloc(&device_ptr, 1024), Status::ok);
  EXPECT_EQ(device.host_malloc(&host_ptr, 1024), Status::injected_fault);
  EXPECT_EQ(host_ptr, nullptr);
  ASSERT_EQ(device.host_malloc(&host_ptr, 1024), Status::ok);
  EXPECT_EQ(device.host_free(host_ptr), Status::ok);
  EXPECT_EQ(device.free(device_ptr), Status::ok);
}

TEST(SimDevice, FreedMemoryIsPoisoned) {
  SimDevice device(SimDeviceOptions{.poison_byte = 0xDB});
  void* ptr = nullptr;
  ASSERT_EQ(device.malloc(&ptr, 4096), Status::ok);
  std::memset(ptr, 0x00, 4096);
  ASSERT_EQ(device.free(ptr), Status::ok);
  // The block is quarantined, still mapped: a stale read sees the poison.
  const auto* stale = static_cast<const unsigned char*>(ptr);
  for (int i = 0; i < 4096; i += 512) EXPECT_EQ(stale[i], 0xDB) << "offset " << i;
  EXPECT_FALSE(device.is_device_pointer(ptr));
}

TEST(SimDevice, CopyPastTheEndOfAnAllocationIsRejected) {
  SimDevice device;
  void* block = nullptr;
  ASSERT_EQ(device.malloc(&block, 1024), Status::ok);
  std::vector<unsigned char> host(4096);
  EXPECT_EQ(device.copy_async(block, host.data(), 4096, Stream{}), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("past the end"), std::string::npos);
  EXPECT_EQ(device.copy_async(host.data(), static_cast<char*>(block) + 512, 1024, Stream{}),
            Status::invalid_argument);
  EXPECT_EQ(device.copy_async(block, host.data(), 1024, Stream{}), Status::ok);
  EXPECT_EQ(device.synchronize(), Status::ok);
  EXPECT_EQ(device.free(block), Status::ok);
}

TEST(SimDevice, ZeroFillOutsideOneDeviceAllocationIsRejected) {
  SimDevice device;
  void* block = nullptr;
  ASSERT_EQ(device.malloc(&block, 1024), Status::ok);
  std::vector<unsigned char> host(64, 0x33);
  EXPECT_EQ(device.fill_zero_async(block, 4096, Stream{}), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("not within one device allocation"), std::string::npos);
  EXPECT_EQ(device.fill_zero_async(host.data(), host.size(), Stream{}), Status::invalid_argument);
  ASSERT_EQ(device.synchronize(), Status::ok);
  EXPECT_EQ(host, std::vector<unsigned char>(64, 0x33));
  EXPECT_EQ(device.free(block), Status::ok);
}

TEST(SimDevice, DelayedCopyIsVisiblyLateWithoutAWait) {
  SimDevice device;
  device.set_copy_delay_ns(50'000'000);
  const std::size_t bytes = 1 << 16;
  std::vector<unsigned char> source(bytes, 0x77), destination(bytes, 0x00);
  void* block = nullptr;
  ASSERT_EQ(device.malloc(&block, bytes), Status::ok);
  Event done;
  ASSERT_EQ(device.create_event(&done), Status::ok);
  ASSERT_EQ(device.copy_async(block, source.data(), bytes, Stream{}), Status::ok);
  ASSERT_EQ(device.copy_async(destination.data(), block, bytes, Stream{}), Status::ok);
  ASSERT_EQ(device.record_event(done, Stream{}), Status::ok);
  // No gate here: the injected delay alone makes the early read wrong.
  EXPECT_EQ(device.query_event(done), Status::not_ready);
#if !defined(__SANITIZE_THREAD__)
  // A read racing the copy on purpose (TSan would rightly report it).
  EXPECT_EQ(destination[0], 0x00);
#endif
  ASSERT_EQ(device.synchronize_event(done), Status::ok);
  EXPECT_EQ(destination, source);
  EXPECT_EQ(device.destroy_event(done), Status::ok);
  EXPECT_EQ(device.free(block), Status::ok);
}

TEST(SimDevice, ModelledCopyDeliversTheTailLast) {
  // 8 MiB at 1 GB/s takes about 8 ms; right after queueing it, the last byte
  // of the destination still holds its old value (Note [Reading before the event]).
  SimDevice device(SimDeviceOptions{.bandwidth_bytes_per_s = 1e9});
  const std::size_t bytes = 8 << 20;
  std::vector<unsigned char> source(bytes, 0x42);
  void* block = nullptr;
  ASSERT_EQ(device.malloc(&block, bytes), Status::ok);
  std::memset(block, 0, bytes);
  Event done;
  ASSERT_EQ(device.create_event(&done), Status::ok);
  ASSERT_EQ(device.copy_async(block, source.data(), bytes, Stream{}), Status::ok);
  ASSERT_EQ(device.record_event(done, Stream{}), Status::ok);
  const auto* bytes_on_device = static_cast<const volatile unsigned char*>(block);
#if !defined(__SANITIZE_THREAD__)
  // Reading while the copy runs is the race this test exists to show; TSan
  // rightly reports it, so under TSan only the delivery is checked.
  if (device.query_event(done) == Status::not_ready) {
    EXPECT_EQ(bytes_on_device[bytes - 1], 0x00);
  }
#endif
  ASSERT_EQ(device.synchronize_event(done), Status::ok);
  EXPECT_EQ(bytes_on_device[bytes - 1], 0x42);
  EXPECT_EQ(device.destroy_event(done), Status::ok);
  EXPECT_EQ(device.free(block), Status::ok);
}

TEST(SimDevice, DefaultStreamCannotBeDestroyed) {
  SimDevice device;
  EXPECT_EQ(device.destroy_stream(Stream{}), Status::invalid_argument);
}

TEST(SimDevice, NameSaysSimAndCapacity) {
  SimDevice device(SimDeviceOptions{.capacity_bytes = std::size_t{2} << 30});
  EXPECT_EQ(device.kind(), DeviceKind::sim);
  EXPECT_EQ(device.name(), "sim (2.00 GiB)");
}

// Note [Virtual memory pages]: mapped pages count against the capacity like
// malloc, and unmapped ones free it again.
TEST(SimDeviceVirtualMemory, MappedPagesShareTheCapacityWithMalloc) {
  constexpr std::size_t kPage = SimDevice::kPageBytes;
  SimDeviceOptions options;
  options.capacity_bytes = 4 * kPage;
  SimDevice device(options);
  void* base = nullptr;
  ASSERT_EQ(device.reserve_address_range(&base, 16 * kPage), Status::ok);
  EXPECT_EQ(device.used_bytes(), 0u) << "address space alone holds no memory";
  ASSERT_EQ(device.map_pages(base, 3 * kPage), Status::ok);
  EXPECT_EQ(device.used_bytes(), 3 * kPage);
  EXPECT_EQ(device.mapped_bytes(), 3 * kPage);
  EXPECT_TRUE(device.is_mapped(base, 3 * kPage));
  EXPECT_TRUE(device.is_device_pointer(static_cast<char*>(base) + kPage));
  void* block = nullptr;
  EXPECT_EQ(device.malloc(&block, 2 * kPage), Status::out_of_memory);
  char* fourth = static_cast<char*>(base) + 3 * kPage;
  EXPECT_EQ(device.map_pages(fourth, 2 * kPage), Status::out_of_memory);
  ASSERT_EQ(device.map_pages(fourth, kPage), Status::ok);
  std::memset(base, 0x5A, 4 * kPage);  // all four pages are real memory
  // Unmapping the middle leaves two runs; its memory counts as free again.
  char* second = static_cast<char*>(base) + kPage;
  ASSERT_EQ(device.unmap_pages(second, 2 * kPage), Status::ok);
  EXPECT_EQ(device.used_bytes(), 2 * kPage);
  EXPECT_FALSE(device.is_mapped(second, 1));
  EXPECT_FALSE(device.is_device_pointer(second));
  EXPECT_TRUE(device.is_mapped(base, kPage));
  EXPECT_TRUE(device.is_mapped(fourth, kPage));
  ASSERT_EQ(device.malloc(&block, 2 * kPage), Status::ok);
  EXPECT_EQ(device.free(block), Status::ok);
  ASSERT_EQ(device.unmap_pages(base, kPage), Status::ok);
  ASSERT_EQ(device.unmap_pages(fourth, kPage), Status::ok);
  EXPECT_EQ(device.mapped_bytes(), 0u);
  EXPECT_EQ(device.release_address_range(base, 16 * kPage), Status::ok);
}

TEST(SimDeviceVirtualMemory, MisuseIsRejectedWithItsReason) {
  constexpr std::size_t kPage = SimDevice::kPageBytes;
  SimDevice device;
  void* base = nullptr;
  ASSERT_EQ(device.reserve_address_range(&base, 4 * kPage), Status::ok);
  char* start = static_cast<char*>(base);
  ASSERT_EQ(device.map_pages(start, 2 * kPage), Status::ok);
  EXPECT_EQ(device.map_pages(start + kPage, 2 * kPage), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("already mapped"), std::string::npos) << device.last_error();
  EXPECT_EQ(device.unmap_pages(start + 2 * kPage, kPage), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("not all mapped"), std::string::npos) << device.last_error();
  EXPECT_EQ(device.map_pages(start + 3 * kPage, 2 * kPage), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("reserved"), std::string::npos) << device.last_error();
  EXPECT_EQ(device.release_address_range(base, 4 * kPage), Status::invalid_argument);
  EXPECT_NE(device.last_error().find("still mapped"), std::string::npos) << device.last_error();
  EXPECT_EQ(device.release_address_range(base, 2 * kPage), Status::invalid_argument);
  ASSERT_EQ(device.unmap_pages(start, 2 * kPage), Status::ok);
  EXPECT_EQ(device.release_address_range(base, 4 * kPage), Status::ok);
}

TEST(SimDeviceVirtualMemory, MapPagesCountsAsAMallocForFaultInjection) {
  constexpr std::size_t kPage = SimDevice::kPageBytes;
  SimDevice device;
  void* base = nullptr;
  ASSERT_EQ(device.reserve_address_range(&base, 2 * kPage), Status::ok);
  device.fail_nth_malloc(1);
  EXPECT_EQ(device.map_pages(base, kPage), Status::injected_fault);
  EXPECT_EQ(device.used_bytes(), 0u);
  ASSERT_EQ(device.map_pages(base, kPage), Status::ok);
  ASSERT_EQ(device.unmap_pages(base, kPage), Status::ok);
  EXPECT_EQ(device.release_address_range(base, 2 * kPage), Status::ok);
}

}  // namespace
}  // namespace spillway
