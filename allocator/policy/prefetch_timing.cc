// Note [Prefetch timed by op durations] (prefetch_timing.h).
#include "allocator/policy/prefetch_timing.h"

#include <algorithm>

namespace spillway {

std::uint64_t arrival_ns(const FetchTiming& timing, std::uint64_t start_ns) {
  return std::max(start_ns, timing.stream_free_at_ns) + timing.copy_ns;
}

bool must_start_now(const FetchTiming& timing) {
  const std::uint64_t later = std::max(timing.now_ns, timing.next_decision_ns);
  if (later <= timing.now_ns) return true;  // no later point to wait for
  const auto margined_copy =
      static_cast<std::uint64_t>(static_cast<double>(timing.copy_ns) * kCopyTimeMargin);
  const std::uint64_t late_arrival =
      std::max(later, timing.stream_free_at_ns) + margined_copy + kMarginNs;
  return late_arrival > timing.use_ns;
}

std::uint64_t expected_stall_ns(const FetchTiming& timing) {
  const std::uint64_t arrival = arrival_ns(timing, timing.now_ns);
  return arrival > timing.use_ns ? arrival - timing.use_ns : 0;
}

}  // namespace spillway
