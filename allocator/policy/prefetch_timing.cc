// Note [Prefetch timed by op durations] (prefetch_timing.h).
#include "allocator/policy/prefetch_timing.h"

#include <algorithm>
#include <limits>

namespace spillway {

std::uint64_t arrival_ns(const FetchTiming& timing, std::uint64_t start_ns) {
  return std::max(start_ns, timing.stream_free_at_ns) + timing.copy_ns;
}

std::uint64_t margined_copy_ns(std::uint64_t copy_ns) {
  return static_cast<std::uint64_t>(static_cast<double>(copy_ns) * kCopyTimeMargin) + kMarginNs;
}

bool must_start_now(const FetchTiming& timing) {
  const std::uint64_t later = std::max(timing.now_ns, timing.next_decision_ns);
  if (later <= timing.now_ns) return true;  // no later point to wait for
  const std::uint64_t late_arrival =
      std::max(later, timing.stream_free_at_ns) + margined_copy_ns(timing.copy_ns);
  return late_arrival > timing.use_ns;
}

std::uint64_t expected_stall_ns(const FetchTiming& timing) {
  const std::uint64_t arrival = arrival_ns(timing, timing.now_ns);
  return arrival > timing.use_ns ? arrival - timing.use_ns : 0;
}

std::uint64_t latest_start_behind(const std::vector<QueuedFetch>& behind) {
  std::uint64_t latest = std::numeric_limits<std::uint64_t>::max();
  for (auto fetch = behind.rbegin(); fetch != behind.rend(); ++fetch) {
    const std::uint64_t arrive_by = std::min(fetch->use_ns, latest);
    const std::uint64_t copy = margined_copy_ns(fetch->copy_ns);
    latest = arrive_by > copy ? arrive_by - copy : 0;
  }
  return latest;
}

}  // namespace spillway
