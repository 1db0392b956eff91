// A plan of gathers from the recorded step: what dist_params:sharded gathers
// and drops at each use, so that gathers can be issued before their use.
//
// Note [A plan of gathers from the recorded step]
// With sharded parameters (Note [Parameters gathered for their use] in
// sharded_params.cc) every rank records, between two step boundaries, the
// sequence of uses of sharded chunk groups: one entry per op, the groups of
// the parameters it uses, consecutive repeats merged. The ranks' sequences
// are the same (every rank must use the same parameters in the same order);
// at the boundary each rank's fingerprint is compared with rank 0's, and
// the sequence becomes a plan, followed by the steps that go the same way
// (Note [Steps that begin alike and part later]).
// The plan says, for each use, which groups are gathered for it and which
// are dropped after it:
//  - A group is dropped after its last use before the boundary (every
//    group is dropped at the boundary anyway), and, when more than `window`
//    groups of one model are present, the one needed again latest is
//    dropped (Belady's choice, which no other choice beats in gathers for
//    the same window). A layer's tensors can straddle two groups, so a
//    window of one would gather groups again and again (docs/data-parallel.md).
//  - Gathers and drops come from the recorded uses alone, never from
//    timing or memory pressure, so every rank issues the same collectives.
// Issuing each gather some gathers ahead of its use, and what happens when
// a step departs from its plan, is sharded_params.cc's.
//
// Note [Steps that begin alike and part later]
// A loop can run steps of several kinds that begin with the same use: an
// eval forward every few steps (the training step's forward, then no
// backward), or a different accumulation count. Plans are kept by recency
// (GatherPlans, at most kMostPlans), not one per first use:
//  - A step follows the most recent plan that begins with its first use.
//  - A use the plan does not have next switches to the most recent other
//    plan whose uses so far are the same and whose next is this use; only
//    when none has it does the step depart. The two plans' drops in the
//    common part differ (each plans its own future), so at the switch the
//    groups the new plan would not hold are dropped, and a group it would
//    hold but the old one dropped is gathered at its next use.
//  - A step that reached its plan's end makes that plan the most recent; a
//    step that departed, or ended before its plan's end (the eval forward
//    following the training plan), is planned and becomes the most recent,
//    in place of a plan of the same uses.
// So after an eval step the next training step follows the eval's plan
// through the forward, switches to the training plan at the backward, and
// issues its gathers ahead throughout, where one plan per first use was
// replaced by each kind in turn and both steps gathered on demand.
#include "hooks/torch/gather_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

namespace spillway::torch_bridge {

namespace {

constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();

// For each use, the index of the next use of each of its groups (kNever
// when none follows).
std::vector<std::vector<std::size_t>> next_uses(std::span<const GroupUse> uses) {
  std::vector<std::vector<std::size_t>> next(uses.size());
  std::map<GroupKey, std::size_t> following;
  for (std::size_t i = uses.size(); i-- > 0;) {
    for (const GroupKey& key : uses[i]) {
      const auto found = following.find(key);
      next[i].push_back(found == following.end() ? kNever : found->second);
    }
    for (const GroupKey& key : uses[i]) following[key] = i;
  }
  return next;
}

}  // namespace

GatherPlan plan_gathers(std::span<const GroupUse> uses, std::size_t window) {
  GatherPlan plan;
  const std::vector<std::vector<std::size_t>> next = next_uses(uses);
  // The groups present, with the index of each one's next use.
  std::map<GroupKey, std::size_t> present;
  for (std::size_t i = 0; i < uses.size(); ++i) {
    PlannedUse& planned = plan.uses.emplace_back();
    planned.groups = uses[i];
    for (std::size_t k = 0; k < uses[i].size(); ++k) {
      const GroupKey& key = uses[i][k];
      if (!present.contains(key)) planned.gathers.push_back(key);
      present[key] = next[i][k];
    }
    plan.gathers.insert(plan.gathers.end(), planned.gathers.begin(), planned.gathers.end());
    planned.gathers_through = plan.gathers.size();
    // After its last use.
    for (auto it = present.begin(); it != present.end();) {
      if (it->second != kNever) {
        ++it;
        continue;
      }
      planned.drops.push_back(it->first);
      it = present.erase(it);
    }
    // Beyond the window: the group needed again latest, never one this use
    // needs (an op may need more than the window holds).
    std::map<std::int64_t, std::size_t> per_model;
    for (const auto& [key, next_use] : present) ++per_model[key.model];
    for (auto& [model, count] : per_model)
      while (count > window) {
        auto latest = present.end();
        for (auto it = present.begin(); it != present.end(); ++it)
          if (it->first.model == model && !std::ranges::binary_search(uses[i], it->first) &&
              (latest == present.end() || it->second > latest->second))
            latest = it;
        if (latest == present.end()) break;
        planned.drops.push_back(latest->first);
        present.erase(latest);
        --count;
      }
  }
  return plan;
}

GroupUse present_at(const GatherPlan& plan, std::size_t at) {
  std::set<GroupKey> present;
  for (std::size_t i = 0; i <= at && i < plan.uses.size(); ++i) {
    const PlannedUse& use = plan.uses[i];
    if (i > 0) {
      const PlannedUse& previous = plan.uses[i - 1];
      for (const GroupKey& key : previous.drops)
        if (std::ranges::binary_search(previous.groups, key)) present.erase(key);
    }
    present.insert(use.groups.begin(), use.groups.end());
    for (const GroupKey& key : use.drops)
      if (!std::ranges::binary_search(use.groups, key)) present.erase(key);
  }
  return GroupUse(present.begin(), present.end());
}

const GatherPlan* GatherPlans::beginning_with(const GroupUse& use) const {
  for (auto plan = plans_.rbegin(); plan != plans_.rend(); ++plan)
    if (!plan->uses.empty() && plan->uses.front().groups == use) return &*plan;
  return nullptr;
}

const GatherPlan* GatherPlans::parting_with(const GatherPlan& current, std::size_t reached,
                                            const GroupUse& use) const {
  if (reached > current.uses.size()) return nullptr;
  for (auto plan = plans_.rbegin(); plan != plans_.rend(); ++plan) {
    if (&*plan == &current || plan->uses.size() <= reached || plan->uses[reached].groups != use)
      continue;
    if (std::equal(current.uses.begin(),
                   current.uses.begin() + static_cast<std::ptrdiff_t>(reached), plan->uses.begin(),
                   [](const PlannedUse& a, const PlannedUse& b) { return a.groups == b.groups; }))
      return &*plan;
  }
  return nullptr;
}

void GatherPlans::followed(const GatherPlan* plan) {
  for (auto it = plans_.begin(); it != plans_.end(); ++it)
    if (&*it == plan) {
      plans_.splice(plans_.end(), plans_, it);
      return;
    }
}

void GatherPlans::keep(std::span<const GroupUse> recorded) {
  // A plan of the same uses is the same plan: moved, not planned again.
  const auto same = std::ranges::find_if(plans_, [&](const GatherPlan& plan) {
    return std::ranges::equal(plan.uses, recorded,
                              [](const PlannedUse& a, const GroupUse& b) { return a.groups == b; });
  });
  if (same != plans_.end()) {
    plans_.splice(plans_.end(), plans_, same);
    return;
  }
  plans_.push_back(plan_gathers(recorded, window_));
  while (plans_.size() > most_) plans_.pop_front();
}

std::uint64_t fingerprint(std::span<const GroupUse> uses) {
  // FNV-1a over the uses' lengths and keys.
  std::uint64_t hash = 14695981039346656037ull;
  const auto mix = [&](std::uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xff;
      hash *= 1099511628211ull;
    }
  };
  mix(uses.size());
  for (const GroupUse& use : uses) {
    mix(use.size());
    for (const GroupKey& key : use) {
      mix(static_cast<std::uint64_t>(key.model));
      mix(static_cast<std::uint64_t>(key.group));
    }
  }
  return hash;
}

}  // namespace spillway::torch_bridge
