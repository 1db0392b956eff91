// The values of a fixed sequence searched by range: the last position in a
// range whose value is above a threshold, in O(log n) (a max segment tree).
// The planned policy asks it, for every prefetch it starts, where non-model
// memory peaks before the chunk's use (Note [Room a prefetch takes early] in
// planned_policy.h); a scan would cost the whole window at every access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace spillway {

class RangeMax {
 public:
  RangeMax() = default;
  explicit RangeMax(const std::vector<std::uint64_t>& values);

  std::size_t size() const { return size_; }
  // The last index in [begin, end) whose value is above `threshold`.
  std::optional<std::size_t> last_above(std::size_t begin, std::size_t end,
                                        std::uint64_t threshold) const;

 private:
  struct Range {
    std::size_t begin;
    std::size_t end;
  };
  std::optional<std::size_t> last_above(std::size_t node, Range covered, Range wanted,
                                        std::uint64_t threshold) const;

  std::size_t size_ = 0;
  std::size_t leaves_ = 0;          // a power of two, at least size_
  std::vector<std::uint64_t> max_;  // node i's children are 2i and 2i+1; leaves from leaves_
};

}  // namespace spillway
