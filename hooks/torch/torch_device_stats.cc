// Note [torch's figures from spillway's] (torch_device_stats.h).
#include "hooks/torch/torch_device_stats.h"

#include <cstddef>

namespace spillway {

namespace {

// torch's Stat and StatArray moved between namespaces across 2.x, so they are
// taken from the DeviceStats member they fill.
template <typename TorchStatArray>
void copy_to_aggregate(const StatArray& from, TorchStatArray* to) {
  constexpr std::size_t kAggregate = 0;  // StatType::AGGREGATE, the "all" entry
  auto& all = (*to)[kAggregate];
  all.current = from.current;
  all.peak = from.peak;
  all.allocated = from.allocated;
  all.freed = from.freed;
}

}  // namespace

c10::cuda::CUDACachingAllocator::DeviceStats to_torch_device_stats(const Stats& stats) {
  c10::cuda::CUDACachingAllocator::DeviceStats torch_stats;
  copy_to_aggregate(stats.allocation, &torch_stats.allocation);
  copy_to_aggregate(stats.segment, &torch_stats.segment);
  copy_to_aggregate(stats.allocated_bytes, &torch_stats.allocated_bytes);
  copy_to_aggregate(stats.reserved_bytes, &torch_stats.reserved_bytes);
  copy_to_aggregate(stats.active_bytes, &torch_stats.active_bytes);
  torch_stats.num_alloc_retries = stats.num_alloc_retries;
  torch_stats.num_ooms = stats.num_ooms;
  torch_stats.num_device_alloc = stats.num_device_alloc;
  torch_stats.num_device_free = stats.num_device_free;
  return torch_stats;
}

}  // namespace spillway
