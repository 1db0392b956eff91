// use_as_torch_cuda_allocator and TorchCudaAllocator: spillway's caching
// allocator as torch's CUDA allocator (design summary in
// torch_cuda_allocator.h), installed from C++ through torch's
// CUDAPluggableAllocator::changeCurrentAllocator, so that a program's
// activations, temporaries and optimizer state share the device budget with
// the chunks. Elsewhere (no usable torch CUDA side) the install says why it
// cannot.
//
// Note [Failing a CUDA allocation]
// torch's CUDAPluggableAllocator does not check the pointer its malloc
// function returns, so a NULL would become a tensor over address 0. The C ABI
// (spillway_malloc) must return NULL, so torch is given this C++ function
// instead, which throws torch's out-of-memory error (c10::OutOfMemoryError,
// Python's torch.OutOfMemoryError and torch.cuda.OutOfMemoryError) with the
// caching allocator's message: the request, budget, reserved and allocated
// bytes, the largest free block and what each pressure handler holds. It
// propagates to the op that allocated. A request of 0 bytes gets no memory
// and no error, as with torch's own allocator.
#include <stdexcept>
#include <string>

#include "hooks/torch/bridge.h"
#include "hooks/torch/spillway_torch.h"

#ifdef SPILLWAY_HAVE_TORCH_CUDA
#include <memory>

#include <c10/core/Allocator.h>

#include "allocator/runtime.h"
#include "hooks/torch/torch_cuda_allocator.h"
#include "hooks/torch/torch_device_stats.h"
#endif

namespace spillway {

#ifdef SPILLWAY_HAVE_TORCH_CUDA
namespace {

// Note [Failing a CUDA allocation].
void* allocate_or_throw(CachingAllocator& allocator, int managed, std::size_t bytes, int device,
                        cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  TORCH_CHECK(device == managed, "spillway manages CUDA device ", managed, " only; device ", device,
              " was asked for ", bytes, " bytes");
  void* ptr = nullptr;
  const Status status = allocator.allocate(&ptr, bytes, Stream{stream});
  TORCH_CHECK_WITH(OutOfMemoryError, status != Status::out_of_memory,
                   "spillway: CUDA out of memory: ", CachingAllocator::last_error());
  TORCH_CHECK(status == Status::ok, "spillway: allocating ", bytes,
              " bytes failed: ", CachingAllocator::last_error());
  return ptr;
}

void deallocate_or_throw(CachingAllocator& allocator, void* ptr) {
  if (ptr == nullptr) return;
  // A free that fails is a pointer spillway did not hand out: a bug in the
  // caller or in spillway, never to be skipped silently.
  TORCH_CHECK(allocator.deallocate(ptr) == Status::ok, "spillway: freeing ", ptr,
              " failed: ", CachingAllocator::last_error());
}

}  // namespace

TorchCudaAllocator::TorchCudaAllocator(CachingAllocator& allocator, int device_ordinal)
    : CUDAPluggableAllocator(
          [to = &allocator, device_ordinal](std::size_t bytes, int device, cudaStream_t stream) {
            return allocate_or_throw(*to, device_ordinal, bytes, device, stream);
          },
          [to = &allocator](void* ptr, std::size_t, int, cudaStream_t) {
            deallocate_or_throw(*to, ptr);
          }),
      allocator_(allocator),
      device_ordinal_(device_ordinal) {
  // torch.cuda.empty_cache(): the base calls its reset function.
  set_reset_fn([to = &allocator] { to->empty_cache(); });
  // Tensor.record_stream: the block is not reused before `stream`'s work so far.
  set_record_stream_fn([to = &allocator](void* ptr, cudaStream_t stream) {
    TORCH_CHECK(to->record_stream(ptr, Stream{stream}) == Status::ok, "spillway: record_stream(",
                ptr, ") failed: ", CachingAllocator::last_error());
  });
}

c10::cuda::CUDACachingAllocator::DeviceStats TorchCudaAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  if (device != device_ordinal_) return {};
  return to_torch_device_stats(allocator_.stats());
}

void TorchCudaAllocator::resetPeakStats(c10::DeviceIndex device) {
  if (device == device_ordinal_) allocator_.reset_peak_stats();
}

void use_as_torch_cuda_allocator() {
  activate();
  Runtime& runtime = Runtime::process();
  if (runtime.device().kind() != DeviceKind::cuda)
    throw std::runtime_error(
        "spillway: use_as_torch_cuda_allocator needs device:cuda (or "
        "device:auto on a usable GPU); spillway is running on " +
        runtime.device().name());
  // A second call (the Python start-up hook, then a script) finds it installed.
  if (dynamic_cast<TorchCudaAllocator*>(c10::cuda::CUDACachingAllocator::get()) != nullptr) return;
  auto allocator =
      std::make_shared<TorchCudaAllocator>(*runtime.active_allocator(), runtime.device_ordinal());
  // As torch's createCustomAllocator does: marked initialized, so torch
  // refuses a later swap instead of freeing spillway's pointers elsewhere.
  allocator->init(0);
  // Throws, naming the cause, once torch's CUDA allocator has handed out memory.
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  // Note [torch's two CUDA allocator slots]
  // changeCurrentAllocator sets the slot c10::cuda::CUDACachingAllocator::get()
  // reads (empty_cuda, torch.cuda's memory functions), not c10's per-device-type
  // registry (c10::GetAllocator(kCUDA), c10::getDeviceAllocator), where torch's
  // own caching allocator stays registered. Code that allocates through the
  // registry then reaches torch's allocator, never initialized because torch
  // initialized spillway's instead: on the H200, a data parallel step over an
  // NCCL group failed its INTERNAL ASSERT "Allocator not initialized for
  // device". Both slots name spillway's; torch holds the shared_ptr for good
  // (the swap above is refused from now on), so the raw pointer stays valid.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/255);
}

#else

void use_as_torch_cuda_allocator() {
  throw std::runtime_error(
      "spillway: this build has no torch CUDA allocator path (it was built against a torch "
      "without CUDA, or one whose CUDA major differs from the toolkit's; see the configure "
      "output's 'spillway:' lines)");
}

#endif

}  // namespace spillway
