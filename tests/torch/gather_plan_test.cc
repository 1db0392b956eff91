// The plan of gathers from a recorded step (hooks/torch/gather_plan.h):
// every use finds its groups present, the window holds, and the plan
// gathers no more than the window's least-recently-used drops would.
#include "hooks/torch/gather_plan.h"

#include <algorithm>
#include <cstddef>
#include <list>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace spillway::torch_bridge {
namespace {

constexpr GroupKey A{0, 0};
constexpr GroupKey B{0, 1};
constexpr GroupKey C{0, 2};

std::vector<GroupUse> singles(std::initializer_list<GroupKey> keys) {
  std::vector<GroupUse> uses;
  for (const GroupKey& key : keys) uses.push_back({key});
  return uses;
}

TEST(GatherPlan, DropsAfterTheLastUse) {
  const std::vector<GroupUse> uses = singles({A, B, C, A});
  const GatherPlan plan = plan_gathers(uses, 2);
  EXPECT_EQ(plan.gathers, (std::vector<GroupKey>{A, B, C}));
  EXPECT_EQ(plan.uses[1].drops, (std::vector<GroupKey>{B}));
  EXPECT_EQ(plan.uses[2].drops, (std::vector<GroupKey>{C}));
  EXPECT_EQ(plan.uses[3].drops, (std::vector<GroupKey>{A}));
  EXPECT_EQ(plan.uses[3].gathers_through, 3u);
}

TEST(GatherPlan, BeyondTheWindowDropsTheGroupNeededLatest) {
  // After C's gather: A is needed at 3, B at 4, so B goes.
  const std::vector<GroupUse> uses = singles({A, B, C, A, B, C});
  const GatherPlan plan = plan_gathers(uses, 2);
  EXPECT_EQ(plan.uses[2].drops, (std::vector<GroupKey>{B}));
  EXPECT_EQ(plan.gathers, (std::vector<GroupKey>{A, B, C, B}));
}

TEST(GatherPlan, EachModelHasItsOwnWindow) {
  const GroupKey first{0, 0};
  const GroupKey second{1, 0};
  const GatherPlan plan = plan_gathers(singles({first, second, first, second}), 1);
  EXPECT_EQ(plan.gathers, (std::vector<GroupKey>{first, second}));
}

TEST(GatherPlan, AnOpNeedingMoreThanTheWindowKeepsWhatItUses) {
  const std::vector<GroupUse> uses{{A, B, C}, {A, B, C}};
  // Consecutive uses differ in a recording; two equal ones still plan.
  const GatherPlan plan = plan_gathers(uses, 1);
  EXPECT_EQ(plan.gathers, (std::vector<GroupKey>{A, B, C}));
  EXPECT_TRUE(plan.uses[0].drops.empty());
  EXPECT_EQ(plan.uses[1].drops.size(), 3u);
}

TEST(GatherPlan, FingerprintsTellSequencesApart) {
  const std::vector<GroupUse> uses = singles({A, B, C});
  std::vector<GroupUse> other = uses;
  EXPECT_EQ(fingerprint(uses), fingerprint(other));
  other[1] = {C};
  EXPECT_NE(fingerprint(uses), fingerprint(other));
  other = uses;
  other[1] = {B, C};
  EXPECT_NE(fingerprint(uses), fingerprint(other));
  EXPECT_NE(fingerprint(uses), fingerprint(singles({A, B})));
}

// Gathers of the same uses with drops by least recent use, as the window
// does on demand.
std::size_t lru_gathers(const std::vector<GroupUse>& uses, std::size_t window) {
  std::map<std::int64_t, std::list<GroupKey>> present;  // per model, most recent first
  std::size_t gathers = 0;
  for (const GroupUse& use : uses) {
    for (const GroupKey& key : use) {
      std::list<GroupKey>& model = present[key.model];
      const auto found = std::ranges::find(model, key);
      if (found == model.end())
        ++gathers;
      else
        model.erase(found);
      model.push_front(key);
    }
    for (auto& [model, keys] : present) {
      std::size_t keep = 0;
      for (const GroupKey& key : use) keep += key.model == model ? 1 : 0;
      while (keys.size() > std::max(window, keep)) keys.pop_back();
    }
  }
  return gathers;
}

// Random recordings: replaying the plan as sharded_params.cc does (the
// previous use's drops, then this use's gathers) finds every group present
// at its use, never gathers a present group, keeps the window, and gathers
// no more than LRU.
TEST(GatherPlan, RandomRecordingsReplayWithinTheWindowAndBeatLru) {
  std::mt19937 random(20261205);
  for (int trial = 0; trial < 300; ++trial) {
    const auto models = static_cast<std::int64_t>(1 + random() % 3);
    const auto groups = static_cast<std::int64_t>(1 + random() % 8);
    const std::size_t window = 1 + random() % 4;
    std::vector<GroupUse> uses;
    const std::size_t count = 1 + random() % 60;
    for (std::size_t attempt = 0; attempt < 4 * count && uses.size() < count; ++attempt) {
      GroupUse use;
      const std::size_t width = 1 + random() % 3;
      for (std::size_t k = 0; k < width; ++k)
        use.push_back(GroupKey{static_cast<std::int64_t>(random() % models),
                               static_cast<std::int64_t>(random() % groups)});
      std::ranges::sort(use);
      use.erase(std::unique(use.begin(), use.end()), use.end());
      if (uses.empty() || uses.back() != use) uses.push_back(use);
    }
    const GatherPlan plan = plan_gathers(uses, window);
    ASSERT_EQ(plan.uses.size(), uses.size());
    std::set<GroupKey> present;
    std::size_t gathered = 0;
    for (std::size_t i = 0; i < uses.size(); ++i) {
      if (i > 0)
        for (const GroupKey& key : plan.uses[i - 1].drops)
          ASSERT_EQ(present.erase(key), 1u) << "trial " << trial << ", use " << i;
      for (const GroupKey& key : plan.uses[i].gathers)
        ASSERT_TRUE(present.insert(key).second) << "trial " << trial << ", use " << i;
      gathered += plan.uses[i].gathers.size();
      ASSERT_EQ(plan.uses[i].gathers_through, gathered);
      for (const GroupKey& key : uses[i])
        ASSERT_TRUE(present.contains(key)) << "trial " << trial << ", use " << i;
      // After this use's drops, each model holds at most the window, or
      // what the use itself needs.
      std::set<GroupKey> after = present;
      for (const GroupKey& key : plan.uses[i].drops) after.erase(key);
      for (std::int64_t model = 0; model < models; ++model) {
        std::size_t held = 0;
        std::size_t needed = 0;
        for (const GroupKey& key : after) held += key.model == model ? 1 : 0;
        for (const GroupKey& key : uses[i]) needed += key.model == model ? 1 : 0;
        ASSERT_LE(held, std::max(window, needed)) << "trial " << trial << ", use " << i;
      }
    }
    for (const GroupKey& key : plan.uses.back().drops) present.erase(key);
    EXPECT_TRUE(present.empty()) << "trial " << trial << ": every group dropped after its last use";
    EXPECT_EQ(gathered, plan.gathers.size());
    EXPECT_LE(plan.gathers.size(), lru_gathers(uses, window)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace spillway::torch_bridge
