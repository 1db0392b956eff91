// CudaDevice: the Device seam over the CUDA runtime, for one GPU.
//
// Each Device operation is one CUDA runtime call (cudaMalloc, cudaHostAlloc,
// cudaMemcpyAsync with cudaMemcpyDefault, cudaLaunchHostFunc, non-blocking
// streams, timing-free events, ...), run with this device current: a cheap
// guard reads the calling thread's current device and switches (and switches
// back) only when it differs, so multi-GPU processes and PyTorch's own device
// guards see no side effect.
//
// Errors become a Status (see to_status in cuda_device.cc); the CUDA detail
// ("cudaMalloc(...) on cuda:0: out of memory [cudaErrorMemoryAllocation]") is
// kept per thread and read with last_error(). A failed call also clears
// CUDA's own per-thread "last error", so a later cudaGetLastError() (PyTorch's
// kernel launch check) does not blame an unrelated kernel for our failure.
//
// A host function (launch_host_function) runs on a CUDA runtime thread and,
// as CUDA requires, must not call CUDA, hence must not call this Device.
//
// This header is CUDA-free on purpose (design section 1): handles travel as the
// void* inside Stream and Event, and only cuda_device.cc includes CUDA headers.
// It is compiled only when the CUDA toolkit is found (SPILLWAY_HAVE_CUDA); on a
// machine without a driver, create() and probe() report why instead of failing
// later.
//
// Virtual memory (page_bytes() and the page calls, Note [Virtual memory
// pages] in device.cc) uses the driver's cuMemAddressReserve, cuMemCreate,
// cuMemMap, cuMemSetAccess, cuMemUnmap and cuMemRelease, reached through
// cudaGetDriverEntryPointByVersion so nothing links libcuda; one physical
// allocation per page, so any page can be unmapped on its own. Where the
// driver lacks them, page_bytes() is 0.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "allocator/device/device.h"

namespace spillway {

class CudaDevice final : public Device {
 public:
  // Tells whether CUDA device `ordinal` is usable here (driver loads, device
  // exists and its context can be made current). When it is not and `reason`
  // is non-null, *reason says why, e.g. "cudaGetDeviceCount: CUDA driver
  // version is insufficient for CUDA runtime version
  // [cudaErrorInsufficientDriver]" or "no CUDA device".
  static bool probe(std::string* reason = nullptr, int ordinal = 0);

  // Makes a CudaDevice for GPU `ordinal`. On failure *out is null and the
  // status is unavailable (no driver, no device), invalid_argument (ordinal
  // out of range) or error; thread_last_error() then holds the CUDA detail.
  static Status create(int ordinal, std::unique_ptr<CudaDevice>* out);

  // The detail of the last CUDA failure seen on this thread by any CudaDevice
  // (or by create/probe); what last_error() returns. Empty when none.
  static std::string thread_last_error();

  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }

 private:
  CudaDevice(int ordinal, std::string name);
  // Finds the driver's virtual memory calls; leaves page_bytes_ 0 without them.
  void load_virtual_memory();

  DeviceKind do_kind() const override { return DeviceKind::cuda; }
  std::string do_name() const override { return name_; }
  Status do_malloc(void** ptr, std::size_t bytes) override;
  Status do_free(void* ptr) override;
  std::size_t do_page_bytes() const override { return page_bytes_; }
  Status do_reserve_address_range(void** base, std::size_t bytes) override;
  Status do_release_address_range(void* base, std::size_t bytes) override;
  Status do_map_pages(void* address, std::size_t bytes) override;
  Status do_unmap_pages(void* address, std::size_t bytes) override;
  Status do_host_malloc(void** ptr, std::size_t bytes) override;
  Status do_host_free(void* ptr) override;
  Status do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  Status do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) override;
  Status do_launch_host_function(Stream stream, HostFunction fn, void* user_data) override;
  Status do_create_stream(Stream* stream) override;
  Status do_destroy_stream(Stream stream) override;
  Status do_synchronize_stream(Stream stream) override;
  Status do_create_event(Event* event) override;
  Status do_destroy_event(Event event) override;
  Status do_record_event(Event event, Stream stream) override;
  Status do_wait_event(Stream stream, Event event) override;
  Status do_query_event(Event event) override;
  Status do_synchronize_event(Event event) override;
  Status do_synchronize() override;
  Status do_memory_info(MemoryInfo* info) override;
  std::uint64_t do_now_ns() const override;
  std::string do_last_error() const override { return thread_last_error(); }

  const int ordinal_;
  const std::string name_;  // "cuda:N <device name>"
  struct DriverCalls;       // the driver entry points (cuda_device.cc)
  std::unique_ptr<DriverCalls> driver_;
  std::size_t page_bytes_ = 0;
  std::mutex pages_mutex_;
  std::map<std::uintptr_t, unsigned long long> page_handles_;  // mapped page -> its allocation
};

}  // namespace spillway
