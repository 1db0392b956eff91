#include "tools/report/sample_selection.h"

#include <algorithm>

namespace spillway::report {

std::vector<std::size_t> select_samples(std::span<const std::uint64_t> times,
                                        const std::vector<std::vector<std::uint64_t>>& values,
                                        std::size_t max_points) {
  const std::size_t count = times.size();
  std::vector<std::size_t> kept;
  if (count <= std::max<std::size_t>(max_points, 2)) {
    kept.resize(count);
    for (std::size_t i = 0; i < count; ++i) kept[i] = i;
    return kept;
  }
  // Each bucket keeps up to one sample per quantity; the first and last
  // samples take two more places.
  const std::size_t per_bucket = std::max<std::size_t>(values.size(), 1);
  const std::size_t bucket_count = std::max<std::size_t>((max_points - 2) / per_bucket, 1);
  const std::uint64_t first = times.front();
  const double span = static_cast<double>(std::max<std::uint64_t>(times.back() - first, 1));

  kept.push_back(0);
  std::size_t begin = 1;
  for (std::size_t bucket = 0; bucket < bucket_count && begin < count - 1; ++bucket) {
    const double bucket_end = span * static_cast<double>(bucket + 1) / bucket_count;
    std::size_t end = begin;
    while (end < count - 1 && static_cast<double>(times[end] - first) < bucket_end) ++end;
    if (bucket + 1 == bucket_count) end = count - 1;
    if (end == begin) continue;
    for (const std::vector<std::uint64_t>& series : values) {
      const auto peak = std::max_element(series.begin() + begin, series.begin() + end);
      kept.push_back(static_cast<std::size_t>(peak - series.begin()));
    }
    begin = end;
  }
  kept.push_back(count - 1);
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return kept;
}

}  // namespace spillway::report
