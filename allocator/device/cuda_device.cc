// CudaDevice over the CUDA runtime. The design summary is in cuda_device.h;
// this file holds the three mechanisms every call shares:
//  - CurrentDeviceGuard: makes the device current for one call and restores
//    the caller's device afterwards (switching only when they differ);
//  - to_status: the one table from cudaError_t to Status;
//  - fail(): records the detail for last_error() and clears CUDA's own
//    per-thread error, see Note [Clearing CUDA's last error].
//
// Note [Clearing CUDA's last error]
// Every failing runtime call also sets the runtime's per-thread "last error",
// which cudaGetLastError() returns and resets. PyTorch checks it after each
// kernel launch (C10_CUDA_KERNEL_LAUNCH_CHECK), so an out-of-memory from our
// cudaMalloc, or a not-ready from cudaEventQuery, left there would surface
// later as a failure of an unrelated kernel. Like PyTorch's own caching
// allocator, we consume it right away. Sticky errors (a faulted context) are
// not cleared by this, and keep failing every later call, as they should.
#include "allocator/device/cuda_device.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

namespace spillway {
namespace {

// Detail of the last failure on this thread, shared by all CudaDevices (a
// thread talks to one CUDA runtime; the detail names the device anyway).
thread_local std::string t_last_error;

constexpr std::size_t kNoSize = std::numeric_limits<std::size_t>::max();

Status to_status(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return Status::ok;
    case cudaErrorNotReady:
      return Status::not_ready;
    case cudaErrorMemoryAllocation:
      return Status::out_of_memory;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryAlreadyRegistered:
      return Status::invalid_argument;
    // The backend cannot run here: no or too old a driver, no device, or the
    // device is taken (exclusive-process mode) or unusable.
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemNotReady:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorInitializationError:
      return Status::unavailable;
    default:
      return Status::error;
  }
}

// "cudaMalloc(1048576 bytes) on cuda:0: out of memory [cudaErrorMemoryAllocation]"
std::string describe(cudaError_t error, const char* call, int ordinal, std::size_t bytes) {
  std::string detail = call;
  if (bytes != kNoSize) detail += "(" + std::to_string(bytes) + " bytes)";
  if (ordinal >= 0) detail += " on cuda:" + std::to_string(ordinal);
  detail += ": ";
  detail += cudaGetErrorString(error);
  detail += " [";
  detail += cudaGetErrorName(error);
  detail += "]";
  return detail;
}

// Turns a runtime result into a Status, keeping the detail of a failure.
// not_ready is an answer, not a failure: it leaves last_error() alone.
Status check(cudaError_t error, const char* call, int ordinal, std::size_t bytes = kNoSize) {
  if (error == cudaSuccess) return Status::ok;
  (void)cudaGetLastError();  // Note [Clearing CUDA's last error]
  if (error != cudaErrorNotReady) t_last_error = describe(error, call, ordinal, bytes);
  return to_status(error);
}

Status invalid_argument(std::string detail) {
  t_last_error = std::move(detail);
  return Status::invalid_argument;
}

// Makes `ordinal` the calling thread's current device for one scope and
// puts the previous one back. cudaGetDevice is a thread-local read, so the
// common single-GPU case costs one cheap call and no switch.
class CurrentDeviceGuard {
 public:
  explicit CurrentDeviceGuard(int ordinal) {
    int current = -1;
    result_ = cudaGetDevice(&current);
    if (result_ != cudaSuccess || current == ordinal) return;
    failed_call_ = "cudaSetDevice";
    result_ = cudaSetDevice(ordinal);
    if (result_ == cudaSuccess) previous_ = current;
  }
  ~CurrentDeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;

  cudaError_t result() const { return result_; }
  // Which of the two calls failed, for the error detail.
  const char* failed_call() const { return failed_call_; }

 private:
  cudaError_t result_ = cudaSuccess;
  const char* failed_call_ = "cudaGetDevice";
  int previous_ = -1;
};

// The shared checks of probe() and create(): the driver loads, the device
// exists, and its primary context can be made current (cudaSetDevice creates
// it since CUDA 12, so exclusive-process conflicts show here, not later).
Status check_usable(int ordinal, std::string* detail) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // Note [Clearing CUDA's last error]
    *detail = describe(error, "cudaGetDeviceCount", -1, kNoSize);
    // cudaGetDeviceCount fails only when CUDA cannot run here at all.
    return to_status(error) == Status::error ? Status::unavailable : to_status(error);
  }
  if (count <= 0) {
    *detail = "no CUDA device";
    return Status::unavailable;
  }
  if (ordinal < 0 || ordinal >= count) {
    *detail = "CUDA device " + std::to_string(ordinal) + " out of range (" + std::to_string(count) +
              " device(s))";
    return Status::invalid_argument;
  }
  CurrentDeviceGuard guard(ordinal);
  if (guard.result() != cudaSuccess) {
    (void)cudaGetLastError();
    *detail = describe(guard.result(), guard.failed_call(), ordinal, kNoSize);
    return to_status(guard.result());
  }
  return Status::ok;
}

cudaStream_t to_cuda(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }
cudaEvent_t to_cuda(Event event) { return static_cast<cudaEvent_t>(event.handle); }

}  // namespace

bool CudaDevice::probe(std::string* reason, int ordinal) {
  std::string detail;
  const bool usable = check_usable(ordinal, &detail) == Status::ok;
  if (reason != nullptr) *reason = usable ? std::string() : detail;
  return usable;
}

Status CudaDevice::create(int ordinal, std::unique_ptr<CudaDevice>* out) {
  if (out == nullptr) return invalid_argument("CudaDevice::create: null out-pointer");
  out->reset();
  std::string detail;
  if (Status status = check_usable(ordinal, &detail); status != Status::ok) {
    t_last_error = std::move(detail);
    return status;
  }
  cudaDeviceProp properties{};
  if (Status status =
          check(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties", ordinal);
      status != Status::ok) {
    return status;
  }
  out->reset(new CudaDevice(ordinal, "cuda:" + std::to_string(ordinal) + " " + properties.name));
  (*out)->load_virtual_memory();
  return Status::ok;
}

struct CudaDevice::DriverCalls {
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  CUmemAllocationProp properties{};
};

CudaDevice::CudaDevice(int ordinal, std::string name) : ordinal_(ordinal), name_(std::move(name)) {}

CudaDevice::~CudaDevice() {
  // Pages still mapped when the device goes: give their memory back.
  if (driver_ == nullptr) return;
  for (const auto& [page, handle] : page_handles_) {
    (void)driver_->unmap(static_cast<CUdeviceptr>(page), page_bytes_);
    (void)driver_->release(static_cast<CUmemGenericAllocationHandle>(handle));
  }
}

namespace {

// One driver call by name, as of CUDA 10.2 (the virtual memory calls' version).
template <typename Function>
bool find_driver_call(const char* name, Function* out) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(name, &function, 10020, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
    (void)cudaGetLastError();  // Note [Clearing CUDA's last error]
    return false;
  }
  *out = reinterpret_cast<Function>(function);
  return true;
}

// "cuMemMap(2097152 bytes) on cuda:0: CUresult 2"
Status check_driver(CUresult result, const char* call, int ordinal, std::size_t bytes) {
  if (result == CUDA_SUCCESS) return Status::ok;
  t_last_error = std::string(call) + "(" + std::to_string(bytes) +
                 " bytes) on cuda:" + std::to_string(ordinal) + ": CUresult " +
                 std::to_string(static_cast<int>(result));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return Status::out_of_memory;
    case CUDA_ERROR_INVALID_VALUE:
      return Status::invalid_argument;
    case CUDA_ERROR_NOT_SUPPORTED:
      return Status::unavailable;
    default:
      return Status::error;
  }
}

}  // namespace

void CudaDevice::load_virtual_memory() {
  auto calls = std::make_unique<DriverCalls>();
  const bool found = find_driver_call("cuMemAddressReserve", &calls->address_reserve) &&
                     find_driver_call("cuMemAddressFree", &calls->address_free) &&
                     find_driver_call("cuMemCreate", &calls->create) &&
                     find_driver_call("cuMemRelease", &calls->release) &&
                     find_driver_call("cuMemMap", &calls->map) &&
                     find_driver_call("cuMemUnmap", &calls->unmap) &&
                     find_driver_call("cuMemSetAccess", &calls->set_access) &&
                     find_driver_call("cuMemGetAllocationGranularity", &calls->granularity);
  if (!found) return;
  calls->properties.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  calls->properties.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  calls->properties.location.id = ordinal_;
  std::size_t granularity = 0;
  if (calls->granularity(&granularity, &calls->properties, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
          CUDA_SUCCESS ||
      granularity == 0) {
    return;
  }
  driver_ = std::move(calls);
  page_bytes_ = granularity;
}

Status CudaDevice::do_reserve_address_range(void** base, std::size_t bytes) {
  if (base == nullptr) return invalid_argument("reserve_address_range: null out-pointer");
  *base = nullptr;
  if (page_bytes_ == 0) return invalid_argument("reserve_address_range: no virtual memory");
  if (bytes == 0 || bytes % page_bytes_ != 0) {
    return invalid_argument("reserve_address_range: " + std::to_string(bytes) +
                            " bytes is not whole pages");
  }
  CUdeviceptr address = 0;
  const Status status = check_driver(driver_->address_reserve(&address, bytes, page_bytes_, 0, 0),
                                     "cuMemAddressReserve", ordinal_, bytes);
  if (status == Status::ok) *base = reinterpret_cast<void*>(address);
  return status;
}

Status CudaDevice::do_release_address_range(void* base, std::size_t bytes) {
  if (page_bytes_ == 0) return invalid_argument("release_address_range: no virtual memory");
  return check_driver(driver_->address_free(reinterpret_cast<CUdeviceptr>(base), bytes),
                      "cuMemAddressFree", ordinal_, bytes);
}

// One physical allocation per page, mapped and made accessible; on a failure
// the pages mapped so far are unmapped again.
Status CudaDevice::do_map_pages(void* address, std::size_t bytes) {
  if (page_bytes_ == 0) return invalid_argument("map_pages: no virtual memory");
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  if (bytes == 0 || bytes % page_bytes_ != 0 || start % page_bytes_ != 0) {
    return invalid_argument("map_pages: not whole pages");
  }
  CUmemAccessDesc access{};
  access.location = driver_->properties.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::lock_guard lock(pages_mutex_);
  for (std::uintptr_t page = start; page < start + bytes; page += page_bytes_) {
    CUmemGenericAllocationHandle handle = 0;
    Status status = check_driver(driver_->create(&handle, page_bytes_, &driver_->properties, 0),
                                 "cuMemCreate", ordinal_, page_bytes_);
    if (status == Status::ok) {
      status = check_driver(driver_->map(static_cast<CUdeviceptr>(page), page_bytes_, 0, handle, 0),
                            "cuMemMap", ordinal_, page_bytes_);
      if (status != Status::ok) (void)driver_->release(handle);
    }
    if (status == Status::ok) {
      page_handles_.emplace(page, handle);
      status =
          check_driver(driver_->set_access(static_cast<CUdeviceptr>(page), page_bytes_, &access, 1),
                       "cuMemSetAccess", ordinal_, page_bytes_);
    }
    if (status != Status::ok) {
      for (std::uintptr_t mapped = start; mapped <= page; mapped += page_bytes_) {
        const auto found = page_handles_.find(mapped);
        if (found == page_handles_.end()) continue;
        (void)driver_->unmap(static_cast<CUdeviceptr>(mapped), page_bytes_);
        (void)driver_->release(static_cast<CUmemGenericAllocationHandle>(found->second));
        page_handles_.erase(found);
      }
      return status;
    }
  }
  return Status::ok;
}

Status CudaDevice::do_unmap_pages(void* address, std::size_t bytes) {
  if (page_bytes_ == 0) return invalid_argument("unmap_pages: no virtual memory");
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  if (bytes == 0 || bytes % page_bytes_ != 0 || start % page_bytes_ != 0) {
    return invalid_argument("unmap_pages: not whole pages");
  }
  // cuMemUnmap does not wait for queued work: the caller orders it (Note
  // [Virtual memory pages] in device.cc), as the simulated device assumes.
  std::lock_guard lock(pages_mutex_);
  for (std::uintptr_t page = start; page < start + bytes; page += page_bytes_) {
    const auto found = page_handles_.find(page);
    if (found == page_handles_.end()) return invalid_argument("unmap_pages: a page is not mapped");
    Status status = check_driver(driver_->unmap(static_cast<CUdeviceptr>(page), page_bytes_),
                                 "cuMemUnmap", ordinal_, page_bytes_);
    if (status == Status::ok) {
      status =
          check_driver(driver_->release(static_cast<CUmemGenericAllocationHandle>(found->second)),
                       "cuMemRelease", ordinal_, page_bytes_);
    }
    page_handles_.erase(found);
    if (status != Status::ok) return status;
  }
  return Status::ok;
}

std::string CudaDevice::thread_last_error() { return t_last_error; }

// Each operation: make the device current, make the one runtime call, check.
// A failure to switch devices is reported as the cudaGetDevice or
// cudaSetDevice call it was.
#define SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal)                              \
  CurrentDeviceGuard device_guard(ordinal);                                   \
  if (device_guard.result() != cudaSuccess) {                                 \
    return check(device_guard.result(), device_guard.failed_call(), ordinal); \
  }

Status CudaDevice::do_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return invalid_argument("malloc: null out-pointer");
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;  // the seam's contract, whatever cudaMalloc(0) does
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaMalloc(ptr, bytes), "cudaMalloc", ordinal_, bytes);
}

Status CudaDevice::do_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;  // what malloc(0) gave
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaFree(ptr), "cudaFree", ordinal_);
}

Status CudaDevice::do_host_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return invalid_argument("host_malloc: null out-pointer");
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  // Portable: the pinning holds for every device's context, not only ours.
  return check(cudaHostAlloc(ptr, bytes, cudaHostAllocPortable), "cudaHostAlloc", ordinal_, bytes);
}

Status CudaDevice::do_host_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaFreeHost(ptr), "cudaFreeHost", ordinal_);
}

Status CudaDevice::do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  // cudaMemcpyDefault: unified addressing tells host from device pointers.
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_cuda(stream)),
               "cudaMemcpyAsync", ordinal_, bytes);
}

Status CudaDevice::do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) {
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaMemsetAsync(dst, 0, bytes, to_cuda(stream)), "cudaMemsetAsync", ordinal_, bytes);
}

Status CudaDevice::do_launch_host_function(Stream stream, HostFunction fn, void* user_data) {
  if (fn == nullptr) return invalid_argument("launch_host_function: null function");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaLaunchHostFunc(to_cuda(stream), fn, user_data), "cudaLaunchHostFunc", ordinal_);
}

Status CudaDevice::do_create_stream(Stream* stream) {
  if (stream == nullptr) return invalid_argument("create_stream: null out-pointer");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  // Non-blocking: our copy streams must not serialize with the legacy
  // default stream that PyTorch's compute runs on.
  cudaStream_t created = nullptr;
  Status status = check(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
                        "cudaStreamCreateWithFlags", ordinal_);
  if (status == Status::ok) stream->handle = created;
  return status;
}

Status CudaDevice::do_destroy_stream(Stream stream) {
  if (stream == Stream{}) return invalid_argument("destroy_stream: the default stream");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaStreamDestroy(to_cuda(stream)), "cudaStreamDestroy", ordinal_);
}

Status CudaDevice::do_synchronize_stream(Stream stream) {
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaStreamSynchronize(to_cuda(stream)), "cudaStreamSynchronize", ordinal_);
}

Status CudaDevice::do_create_event(Event* event) {
  if (event == nullptr) return invalid_argument("create_event: null out-pointer");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  // Timing-free events are the cheap kind: they only order and signal.
  cudaEvent_t created = nullptr;
  Status status = check(cudaEventCreateWithFlags(&created, cudaEventDisableTiming),
                        "cudaEventCreateWithFlags", ordinal_);
  if (status == Status::ok) event->handle = created;
  return status;
}

Status CudaDevice::do_destroy_event(Event event) {
  if (event == Event{}) return invalid_argument("destroy_event: null event");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaEventDestroy(to_cuda(event)), "cudaEventDestroy", ordinal_);
}

Status CudaDevice::do_record_event(Event event, Stream stream) {
  if (event == Event{}) return invalid_argument("record_event: null event");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaEventRecord(to_cuda(event), to_cuda(stream)), "cudaEventRecord", ordinal_);
}

Status CudaDevice::do_wait_event(Stream stream, Event event) {
  if (event == Event{}) return invalid_argument("wait_event: null event");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaStreamWaitEvent(to_cuda(stream), to_cuda(event), 0), "cudaStreamWaitEvent",
               ordinal_);
}

Status CudaDevice::do_query_event(Event event) {
  if (event == Event{}) return invalid_argument("query_event: null event");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaEventQuery(to_cuda(event)), "cudaEventQuery", ordinal_);
}

Status CudaDevice::do_synchronize_event(Event event) {
  if (event == Event{}) return invalid_argument("synchronize_event: null event");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaEventSynchronize(to_cuda(event)), "cudaEventSynchronize", ordinal_);
}

Status CudaDevice::do_synchronize() {
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", ordinal_);
}

Status CudaDevice::do_memory_info(MemoryInfo* info) {
  if (info == nullptr) return invalid_argument("memory_info: null out-pointer");
  SPILLWAY_MAKE_CURRENT_OR_RETURN(ordinal_);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  Status status = check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", ordinal_);
  if (status == Status::ok) *info = MemoryInfo{free_bytes, total_bytes};
  return status;
}

#undef SPILLWAY_MAKE_CURRENT_OR_RETURN

std::uint64_t CudaDevice::do_now_ns() const {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace spillway
