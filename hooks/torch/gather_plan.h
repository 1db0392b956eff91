// gather_plan.h: which parameter chunk groups a rank gathers and drops at
// each use of a step, planned from the uses of a recorded step (Note [A
// plan of gathers from the recorded step] in gather_plan.cc). Private to
// hooks/torch; no torch in it.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
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

// A 64-bit fingerprint of `uses`, to compare the ranks' recordings.
std::uint64_t fingerprint(std::span<const GroupUse> uses);

}  // namespace spillway::torch_bridge
