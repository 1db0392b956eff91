#include "tools/report/sample_selection.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace spillway::report {
namespace {

TEST(SelectSamples, ShortSeriesKeptWhole) {
  const std::vector<std::uint64_t> times = {1, 2, 3};
  EXPECT_EQ(select_samples(times, {{5, 6, 7}}, 2000), (std::vector<std::size_t>{0, 1, 2}));
}

TEST(SelectSamples, LongSeriesKeepsPeaksEndsAndLimit) {
  constexpr std::size_t kCount = 100000;
  std::vector<std::uint64_t> times(kCount), first(kCount), second(kCount);
  for (std::size_t i = 0; i < kCount; ++i) {
    times[i] = 10 * i;
    first[i] = i % 977;
    second[i] = (i * 7919) % 10007;
  }
  first[54321] = 1'000'000;  // a lone spike in each series
  second[12345] = 2'000'000;
  const std::vector<std::size_t> kept = select_samples(times, {first, second}, 2000);
  EXPECT_LE(kept.size(), 2000u);
  EXPECT_GE(kept.size(), 1000u);
  EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
  EXPECT_EQ(kept.front(), 0u);
  EXPECT_EQ(kept.back(), kCount - 1);
  EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), 54321u));
  EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), 12345u));
}

TEST(SelectSamples, AllAtOneTime) {
  const std::vector<std::uint64_t> times(5000, 42);
  std::vector<std::uint64_t> values(5000, 1);
  values[4000] = 9;
  const std::vector<std::size_t> kept = select_samples(times, {values}, 100);
  EXPECT_LE(kept.size(), 100u);
  EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), 4000u));
}

}  // namespace
}  // namespace spillway::report
