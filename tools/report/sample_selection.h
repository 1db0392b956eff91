// Downsampling for the charts: which samples of a long series to draw so a
// page stays small (at most ~2000 points a series) without hiding peaks.
//
// The time axis is cut into equal buckets; in each bucket the sample holding
// the bucket's largest value of every tracked quantity is kept (so the drawn
// peaks are the true peaks), plus the first and the last sample of the
// series. Series no longer than the limit are kept whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace spillway::report {

// `times` is non-decreasing; each of `values` has one entry per time.
// Returns increasing indexes into `times`, at most max(max_points, 2) of them.
std::vector<std::size_t> select_samples(std::span<const std::uint64_t> times,
                                        const std::vector<std::vector<std::uint64_t>>& values,
                                        std::size_t max_points);

}  // namespace spillway::report
