// TorchCudaAllocator: spillway's caching allocator behind torch's CUDA
// allocator interface, the object use_as_torch_cuda_allocator() installs
// (spillway_torch.h; the Python package's use_as_torch_cuda_allocator and its
// start-up hook call the same).
//
// Design summary:
//  - A subclass of torch's CUDAPluggableAllocator, so torch's bookkeeping
//    (sizes and streams of live pointers, the DataPtr deleter) stays torch's.
//    The functions torch hands it allocate and free in one CachingAllocator;
//    empty_cache and record_stream go through the setters the base offers.
//  - What the base refuses (TORCH_CHECK(false)) and scripts call, it answers
//    from spillway's figures: getDeviceStats (torch.cuda.memory_stats and the
//    functions that read it) and resetPeakStats. resetAccumulatedStats still
//    refuses: spillway never resets its running totals.
//  - Note [Failing a CUDA allocation] (torch_cuda_allocator.cc): it throws
//    torch's out-of-memory error, never returns NULL for a non-empty request.
//  - It talks to no GPU itself, so the tests drive it over a simulated
//    device, calling malloc / raw_delete / the statistics directly (torch's
//    allocate() asks CUDA for the current device and stream).
//
// Built where torch's CUDA side is usable (SPILLWAY_HAVE_TORCH_CUDA): a CUDA
// torch whose CUDA major is the toolkit's.
#pragma once

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "allocator/caching/caching_allocator.h"

namespace spillway {

class TorchCudaAllocator final
    : public torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
 public:
  // Serves device `device_ordinal` from `allocator`, which outlives it (the
  // process runtime's allocator lives forever).
  TorchCudaAllocator(CachingAllocator& allocator, int device_ordinal);

  // spillway's figures for its device (Note [torch's figures from spillway's]
  // in torch_device_stats.h); all 0 for another device, where spillway
  // allocates nothing.
  c10::cuda::CUDACachingAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  // Every peak back to its current value.
  void resetPeakStats(c10::DeviceIndex device) override;

 private:
  CachingAllocator& allocator_;
  int device_ordinal_;
};

}  // namespace spillway
