// use_as_torch_cuda_allocator: spillway's caching allocator as torch's CUDA
// allocator, installed from C++ through torch's CUDAPluggableAllocator (the
// class behind Python's torch.cuda.memory.CUDAPluggableAllocator), so that a
// LibTorch program's activations, temporaries and optimizer state share the
// device budget with the chunks.
//
// Built against a CUDA torch whose CUDA major is the toolkit's
// (SPILLWAY_HAVE_TORCH_CUDA, cmake/FindTorchThroughPython.cmake); elsewhere
// the function says why it cannot install.
//
// Note [Failing a CUDA allocation]
// torch's CUDAPluggableAllocator does not check the pointer its malloc
// function returns, so a NULL would become a tensor over address 0. The
// function throws torch's out-of-memory error instead (c10::OutOfMemoryError,
// Python's torch.OutOfMemoryError), which propagates to the op that allocated.
// A request of 0 bytes gets no memory and no error, as with torch's own
// allocator.
#include <stdexcept>
#include <string>

#include "hooks/torch/bridge.h"
#include "hooks/torch/spillway_torch.h"

#ifdef SPILLWAY_HAVE_TORCH_CUDA
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "allocator/caching/caching_allocator.h"
#include "allocator/runtime.h"
#endif

namespace spillway {

#ifdef SPILLWAY_HAVE_TORCH_CUDA
namespace {

CachingAllocator& installed_allocator() {
  CachingAllocator* allocator = Runtime::process().active_allocator();
  // Installation activated the runtime, which is never torn down.
  TORCH_INTERNAL_ASSERT(allocator != nullptr,
                        "spillway: the CUDA allocator is used before activation");
  return *allocator;
}

// Note [Failing a CUDA allocation].
void* allocate(std::size_t bytes, int device, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  const int managed = Runtime::process().device_ordinal();
  TORCH_CHECK(device == managed, "spillway manages CUDA device ", managed, " only; device ", device,
              " was asked for ", bytes, " bytes");
  void* ptr = nullptr;
  if (installed_allocator().allocate(&ptr, bytes, Stream{stream}) != Status::ok)
    TORCH_CHECK_WITH(OutOfMemoryError, false,
                     "spillway: CUDA out of memory: ", CachingAllocator::last_error());
  return ptr;
}

void deallocate(void* ptr, std::size_t /*bytes*/, int /*device*/, cudaStream_t /*stream*/) {
  if (ptr == nullptr) return;
  // A free that fails is a pointer spillway did not hand out: a bug in the
  // caller or in spillway, never to be skipped silently.
  TORCH_CHECK(installed_allocator().deallocate(ptr) == Status::ok, "spillway: freeing ", ptr,
              " failed: ", CachingAllocator::last_error());
}

}  // namespace

void use_as_torch_cuda_allocator() {
  activate();
  Runtime& runtime = Runtime::process();
  if (runtime.device().kind() != DeviceKind::cuda)
    throw std::runtime_error(
        "spillway: use_as_torch_cuda_allocator needs device:cuda (or "
        "device:auto on a usable GPU); spillway is running on " +
        runtime.device().name());
  auto allocator = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(allocate, deallocate);
  auto* pluggable =
      dynamic_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator*>(allocator.get());
  TORCH_INTERNAL_ASSERT(pluggable != nullptr);
  pluggable->set_record_stream_fn([](void* ptr, cudaStream_t stream) {
    TORCH_CHECK(installed_allocator().record_stream(ptr, Stream{stream}) == Status::ok,
                "spillway: record_stream(", ptr, ") failed: ", CachingAllocator::last_error());
  });
  // Throws, naming the cause, once torch's CUDA allocator has handed out memory.
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
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
