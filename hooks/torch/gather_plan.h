// gather_plan.h: which parameter chunk groups a rank gathers and drops at
// each use of a step, planned from the uses of a recorded step (Note [A
// plan of gathers from the recorded step] in gather_plan.cc). Private to
// hooks/torch; no torch in it.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <vector>

namespace spillway::torch_bridge {

// A chunk group of one model: the model's position among every model's
// layouts and the group's index in it, the same on every rank.
struct GroupKey {
  std::int64_t model = 0;
  std::int64_t group = 0;
  auto operator<=>(const GroupKey&) const = default;
};

// The sharded groups one op uses, sorted, each once.
using GroupUse = std::vector<GroupKey>;

// One use of the plan: the groups it needs, those gathered for it (absent
// before), and those dropped after it.
struct PlannedUse {
  GroupUse groups;
  std::vector<GroupKey> gathers;
  std::vector<GroupKey> drops;
  std::size_t gathers_through = 0;  // of the plan's gathers, those for this use and before
};

struct GatherPlan {
  std::vector<PlannedUse> uses;
  std::vector<GroupKey> gathers;  // every use's, in order
};

// Plans the gathers and drops of `uses` (consecutive uses differ), with
// every group absent at the start and at most `window` groups of one model
// present after any use: Belady's choice (drop the group needed again
// latest), and every group dropped after its last use.
GatherPlan plan_gathers(std::span<const GroupUse> uses, std::size_t window);

// The groups present once the plan's use `at` is reached: gathered for it
// or before and not dropped since, its drops of its own groups still to
// come (they wait for the next use).
GroupUse present_at(const GatherPlan& plan, std::size_t at);

// The plans kept, the most recently followed last (Note [Steps that begin
// alike and part later] in gather_plan.cc).
class GatherPlans {
 public:
  GatherPlans(std::size_t most, std::size_t window) : most_(most), window_(window) {}

  // The most recent plan that begins with `use`, or null.
  const GatherPlan* beginning_with(const GroupUse& use) const;
  // The most recent plan, other than `current`, whose first `reached` uses
  // are `current`'s and whose next one is `use`, or null.
  const GatherPlan* parting_with(const GatherPlan& current, std::size_t reached,
                                 const GroupUse& use) const;
  // A step followed `plan`, one of these, to its end: now the most recent.
  void followed(const GatherPlan* plan);
  // A recorded step: planned and the most recent, in place of a plan of
  // the same uses; beyond `most` plans, the least recent goes.
  void keep(std::span<const GroupUse> recorded);
  void clear() { plans_.clear(); }
  std::size_t size() const { return plans_.size(); }

 private:
  std::size_t most_;
  std::size_t window_;
  std::list<GatherPlan> plans_;  // a list: a step's plan stays put while it is followed
};

// A 64-bit fingerprint of `uses`, to compare the ranks' recordings.
std::uint64_t fingerprint(std::span<const GroupUse> uses);

}  // namespace spillway::torch_bridge
