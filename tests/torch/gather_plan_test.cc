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
// Up to `count` uses of one to three random groups each, consecutive ones
// different, as a recording has them.
std::vector<GroupUse> random_uses(std::mt19937& random, std::int64_t models, std::int64_t groups,
                                  std::size_t count) {
  std::vector<GroupUse> uses;
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
  return uses;
}

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
    const std::vector<GroupUse> uses = random_uses(random, models, groups, 1 + random() % 60);
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

// What the runtime does at a planned use (sharded_params.cc's reach): the
// previous use's drops of its own groups, this use's groups made present
// (gathered where absent: counted), its drops of others.
struct Replay {
  std::set<GroupKey> present;
  std::size_t gathered = 0;

  void reach(const GatherPlan& plan, std::size_t at) {
    if (at > 0)
      for (const GroupKey& key : plan.uses[at - 1].drops)
        if (std::ranges::binary_search(plan.uses[at - 1].groups, key)) present.erase(key);
    for (const GroupKey& key : plan.uses[at].groups) gathered += present.insert(key).second;
    for (const GroupKey& key : plan.uses[at].drops)
      if (!std::ranges::binary_search(plan.uses[at].groups, key)) present.erase(key);
  }
  void end(const GatherPlan& plan) {
    for (const GroupKey& key : plan.uses.back().drops) present.erase(key);
  }
};

TEST(GatherPlan, PresentAtIsWhatTheRuntimeHoldsAtEachUse) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<GroupUse> uses = random_uses(random, 2, 6, 1 + random() % 40);
    const GatherPlan plan = plan_gathers(uses, 1 + random() % 3);
    Replay replay;
    for (std::size_t at = 0; at < uses.size(); ++at) {
      replay.reach(plan, at);
      EXPECT_EQ(present_at(plan, at), GroupUse(replay.present.begin(), replay.present.end()))
          << "trial " << trial << ", use " << at;
    }
  }
}

TEST(GatherPlans, TheMostRecentPlanBeginningWithAUseIsFollowed) {
  GatherPlans plans(/*most=*/2, /*window=*/2);
  const std::vector<GroupUse> train = singles({A, B, C, B, A});
  const std::vector<GroupUse> eval = singles({A, B, C});
  EXPECT_EQ(plans.beginning_with({A}), nullptr);
  plans.keep(train);
  const GatherPlan* train_plan = plans.beginning_with({A});
  ASSERT_NE(train_plan, nullptr);
  EXPECT_EQ(train_plan->uses.size(), 5u);
  plans.keep(eval);
  const GatherPlan* eval_plan = plans.beginning_with({A});
  ASSERT_NE(eval_plan, nullptr);
  EXPECT_EQ(eval_plan->uses.size(), 3u);
  EXPECT_EQ(plans.beginning_with({B}), nullptr);
  // Followed to its end, the training plan is the most recent again; the
  // eval's plan stays where it is.
  plans.followed(train_plan);
  EXPECT_EQ(plans.beginning_with({A}), train_plan);
  EXPECT_EQ(eval_plan->uses.size(), 3u);
  // The same uses again: one plan, the most recent.
  plans.keep(eval);
  EXPECT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans.beginning_with({A})->uses.size(), 3u);
  // A third kind: the least recent (training) goes.
  plans.keep(singles({C, A}));
  EXPECT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans.beginning_with({A})->uses.size(), 3u);
  ASSERT_NE(plans.beginning_with({C}), nullptr);
  plans.clear();
  EXPECT_EQ(plans.size(), 0u);
}

TEST(GatherPlans, AStepPartsOnlyToAPlanThatWentTheSameWaySoFar) {
  GatherPlans plans(8, 2);
  plans.keep(singles({A, B, C}));     // an eval
  plans.keep(singles({A, B, A, C}));  // a training step
  plans.keep(singles({A, C, B}));     // a third kind, the most recent
  const GatherPlan* third = plans.beginning_with({A});
  ASSERT_NE(third, nullptr);
  ASSERT_EQ(third->uses.size(), 3u);
  EXPECT_EQ(third->uses[1].groups, GroupUse{C});
  // After {A}, B instead of C: the more recent of the two that go {A, B}.
  const GatherPlan* training = plans.parting_with(*third, 1, {B});
  ASSERT_NE(training, nullptr);
  EXPECT_EQ(training->uses.size(), 4u);
  // After {A, B}, C instead of A: the eval.
  const GatherPlan* eval = plans.parting_with(*training, 2, {C});
  ASSERT_NE(eval, nullptr);
  EXPECT_EQ(eval->uses.size(), 3u);
  EXPECT_EQ(plans.parting_with(*eval, 2, {A}), training);
  // No plan goes {A, B, B}, none has the eval's {A, B, C} and more, and
  // none parts beyond the current plan's uses.
  EXPECT_EQ(plans.parting_with(*training, 2, {B}), nullptr);
  EXPECT_EQ(plans.parting_with(*eval, 3, {C}), nullptr);
  EXPECT_EQ(plans.parting_with(*training, 5, {A}), nullptr);
}

// Two recordings that share a random first part: a step of the second kind
// follows the first kind's plan through that part, switches, and still
// finds every use's groups present, holds at most the window after each
// use's drops, and ends with every group dropped.
TEST(GatherPlans, ASwitchedStepKeepsTheWindowAndEndsWithEverythingDropped) {
  std::mt19937 random(20261206);
  int switched = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const auto models = static_cast<std::int64_t>(1 + random() % 2);
    const std::size_t window = 1 + random() % 3;
    const std::vector<GroupUse> common = random_uses(random, models, 6, 1 + random() % 20);
    std::vector<GroupUse> first = common, second = common;
    for (const GroupUse& use : random_uses(random, models, 6, 1 + random() % 20))
      if (first.back() != use) first.push_back(use);
    for (const GroupUse& use : random_uses(random, models, 6, 1 + random() % 20))
      if (second.back() != use) second.push_back(use);
    GatherPlans plans(8, window);
    plans.keep(second);
    plans.keep(first);
    const GatherPlan* plan = plans.beginning_with(second.front());
    ASSERT_NE(plan, nullptr);
    Replay replay;
    for (std::size_t at = 0; at < second.size(); ++at) {
      if (at >= plan->uses.size() || plan->uses[at].groups != second[at]) {
        const GatherPlan* other = plans.parting_with(*plan, at, second[at]);
        ASSERT_NE(other, nullptr) << "trial " << trial << ", use " << at;
        const GroupUse held = present_at(*other, at - 1);
        std::erase_if(replay.present,
                      [&](const GroupKey& key) { return !std::ranges::binary_search(held, key); });
        plan = other;
        ++switched;
      }
      replay.reach(*plan, at);
      for (const GroupKey& key : second[at]) ASSERT_TRUE(replay.present.contains(key));
      // Once this use's own drops are made (at the next use).
      std::set<GroupKey> after = replay.present;
      for (const GroupKey& key : plan->uses[at].drops) after.erase(key);
      for (std::int64_t model = 0; model < models; ++model) {
        std::size_t count = 0, needed = 0;
        for (const GroupKey& key : after) count += key.model == model ? 1 : 0;
        for (const GroupKey& key : second[at]) needed += key.model == model ? 1 : 0;
        ASSERT_LE(count, std::max(window, needed)) << "trial " << trial << ", use " << at;
      }
    }
    // A step that ends before its plan's end (its uses are the start of
    // the other kind's) leaves the rest to the boundary, which drops all.
    if (plan->uses.size() != second.size()) continue;
    replay.end(*plan);
    EXPECT_TRUE(replay.present.empty()) << "trial " << trial;
  }
  EXPECT_GT(switched, 100);  // most trials part after the common uses
}

}  // namespace
}  // namespace spillway::torch_bridge
