// RangeMax (allocator/policy/range_max.h): the last index above a threshold
// in any range, against a scan, on random sequences of every small length.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "allocator/policy/range_max.h"

namespace spillway::testing {
namespace {

std::optional<std::size_t> scanned(const std::vector<std::uint64_t>& values, std::size_t begin,
                                   std::size_t end, std::uint64_t threshold) {
  for (std::size_t i = std::min(end, values.size()); i-- > begin;) {
    if (values[i] > threshold) return i;
  }
  return std::nullopt;
}

TEST(RangeMax, TheLastIndexAboveAThresholdIsAScansOnEveryRange) {
  std::mt19937_64 random(7);
  for (std::size_t size = 0; size <= 40; ++size) {
    std::vector<std::uint64_t> values(size);
    for (std::uint64_t& value : values) value = random() % 10;
    const RangeMax index(values);
    EXPECT_EQ(index.size(), size);
    for (std::size_t begin = 0; begin <= size; ++begin) {
      for (std::size_t end = begin; end <= size + 1; ++end) {
        for (std::uint64_t threshold = 0; threshold <= 10; ++threshold) {
          ASSERT_EQ(index.last_above(begin, end, threshold), scanned(values, begin, end, threshold))
              << "size " << size << ", [" << begin << ", " << end << "), above " << threshold;
        }
      }
    }
  }
}

TEST(RangeMax, AnEmptyIndexFindsNothing) {
  const RangeMax empty;
  EXPECT_EQ(empty.last_above(0, 5, 0), std::nullopt);
  const RangeMax zeros(std::vector<std::uint64_t>(1000, 0));
  EXPECT_EQ(zeros.last_above(0, 1000, 0), std::nullopt);
  EXPECT_EQ(zeros.last_above(3, 2, 0), std::nullopt) << "an inverted range is empty";
}

}  // namespace
}  // namespace spillway::testing
