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
// the sequence becomes the plan of the steps that start with the same use.
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
