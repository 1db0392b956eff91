// The median the benchmark programs report their figures by.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace spillway::bench {

// The middle value, or the mean of the two middle ones for an even count;
// `values` must not be empty.
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace spillway::bench
