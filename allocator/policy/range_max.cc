#include "allocator/policy/range_max.h"

#include <algorithm>

namespace spillway {

RangeMax::RangeMax(const std::vector<std::uint64_t>& values) : size_(values.size()) {
  leaves_ = 1;
  while (leaves_ < size_) leaves_ *= 2;
  max_.assign(2 * leaves_, 0);
  std::ranges::copy(values, max_.begin() + static_cast<std::ptrdiff_t>(leaves_));
  for (std::size_t node = leaves_ - 1; node >= 1; --node)
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]);
}

std::optional<std::size_t> RangeMax::last_above(std::size_t begin, std::size_t end,
                                                std::uint64_t threshold) const {
  end = std::min(end, size_);
  if (begin >= end) return std::nullopt;
  return last_above(1, {0, leaves_}, {begin, end}, threshold);
}

// Right child first; a subtree whose largest value is not above the
// threshold is skipped whole, so only O(log n) nodes are opened.
std::optional<std::size_t> RangeMax::last_above(std::size_t node, Range covered, Range wanted,
                                                std::uint64_t threshold) const {
  if (covered.end <= wanted.begin || wanted.end <= covered.begin) return std::nullopt;
  if (max_[node] <= threshold) return std::nullopt;
  if (covered.end - covered.begin == 1) return covered.begin;
  const std::size_t middle = covered.begin + (covered.end - covered.begin) / 2;
  if (std::optional<std::size_t> found =
          last_above(2 * node + 1, {middle, covered.end}, wanted, threshold)) {
    return found;
  }
  return last_above(2 * node, {covered.begin, middle}, wanted, threshold);
}

}  // namespace spillway
