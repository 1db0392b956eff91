// to_torch_device_stats: spillway's statistics as torch's DeviceStats, the
// figures torch.cuda.memory_stats(), memory_allocated(), max_memory_allocated()
// and memory_reserved() read when spillway is torch's CUDA allocator
// (torch_cuda_allocator.h). A pure function, so it is tested without a GPU.
//
// Built where torch's CUDA side is usable (SPILLWAY_HAVE_TORCH_CUDA).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include "allocator/config/stats.h"

namespace spillway {

// Note [torch's figures from spillway's]
// torch keeps each figure three times: for all blocks, the small pool and the
// large pool (StatType). spillway keeps one total per figure, so the "all"
// entry carries it and the per-pool entries stay 0. The figures spillway does
// not keep (counts of active and inactive-split blocks, requested bytes,
// oversize figures, max_split_size) are 0 too. Chunks are blocks of the
// caching allocator, so allocated_bytes and reserved_bytes include model data
// as well as what torch allocated: the one device budget, as the user sees it.
c10::cuda::CUDACachingAllocator::DeviceStats to_torch_device_stats(const Stats& stats);

}  // namespace spillway
