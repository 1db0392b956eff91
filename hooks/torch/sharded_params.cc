// Parameters gathered for their use: with dist_params:sharded each rank
// keeps the parameters it owns, and the others' only while ops use them.
//
// Note [Parameters gathered for their use]
// With dist_params:sharded a rank drops the bytes of the parameters it does
// not own (every member of a chunk group but its own: Note [Chunk groups
// across ranks] in rank_layout.cc) whenever the owners' values are final:
// at manage(), and at every step boundary, where the owners' optimizer
// steps have made them stale. Parameter memory per rank is then its 1/N
// plus what the ops in flight use. What no optimizer steps (buffers, frozen
// parameters) stays on every rank (Note [What no optimizer steps comes from
// rank 0] in data_parallel.cc).
//  - Whether a group is dropped is the same on every rank. An op that uses
//    a parameter of a dropped group gathers the group first, on every rank,
//    its owners' too: the op hook calls gather_for_op before it acquires
//    the op's inputs. That is one all-gather of the owners' bytes
//    (gather_chunk_group), after one of a small header, the model and the
//    group, which every rank checks.
//  - A gather is a collective, so every rank must gather the same groups in
//    the same order: every rank must use the same parameters in the same
//    order, as FSDP asks of its modules. A layer that one rank's
//    micro-batch skips leaves that rank's gather unmatched; where the
//    ranks meet in gathers of different groups, the headers say so and
//    every rank fails, naming both (dist_params:replicated has no such
//    rule).
//  - What stays gathered follows from the uses alone, so it is the same on
//    every rank: each model keeps at most kGatheredGroupsPerModel groups gathered,
//    and a gather beyond them drops the group whose last use is oldest,
//    never one the op itself uses or one an op running on this thread
//    holds (a use or a hold of an owned parameter counts as on the others). Memory pressure never
//    drops a group: a gathered chunk is spilled like any other, so which collectives run never
//    depends on it.
//  - Dropping is ChunkManager::discard: the chunk's payloads go on both
//    sides, and it reads as zeros until a gather writes it, straight into
//    the chunk (no op on the parameter, so autograd's version counter stays).
//    A group whose write fails is dropped again, so no op computes on bytes
//    that did not arrive.
//  - Gathers and drops follow a plan from a recorded step where one
//    applies (Note [Gathers issued ahead of their use]); the window above
//    serves the steps without one.
//
// Note [Gathers issued ahead of their use]
// Between two step boundaries each rank records its uses of sharded chunk
// groups; at the boundary the ranks compare fingerprints of them (every
// rank must have used the same parameters in the same order: a difference
// is an error naming the rank) and the recording becomes a plan (Note [A
// plan of gathers from the recorded step] in gather_plan.cc). rank 0's
// plan is every rank's: the fingerprints show the recordings are the same,
// so nothing more is sent.
// A step follows the most recent plan that begins with its first use
// (Note [Steps that begin alike and part later] in gather_plan.cc):
//  - At each planned use the groups it needs are made present (a gather
//    issued ahead is waited for, checked and written; one not issued is
//    gathered there), then the plan's drops of other groups beyond the
//    window are made; its drops of the groups the use needs wait for the
//    next planned use. A group an op on this thread holds is never dropped.
//  - Then the plan's next kGathersAhead gathers are issued, in the plan's
//    order, each once its group is absent and only of the models the use
//    uses (a model whose parameters went since the recording, which a rank
//    may notice sooner than another, is never gathered ahead); the bytes
//    stay in the staging buffer until their use, so a gathered chunk never
//    waits in the budget. Every rank issues them at the same use, so the
//    collectives match.
//  - A use the plan does not have next finishes the gathers in flight and
//    switches to the most recent other plan that went the same way so far
//    and has this use next (the training step after an eval's forward),
//    dropping what that plan would not hold; where none has it, the step
//    departs and goes on with the window's gathers on demand. Every rank
//    switches or departs at the same use. The recording of a step that
//    departed, ended before its plan's end, or had none becomes a plan at
//    the boundary.
// At the boundary, gathers never used are waited for and discarded.
//
// Note [Uses only the owner makes]
// The optimizers' step touches the parameters this rank owns, and every
// other rank touches its own: uses no other rank mirrors, so they must not
// gather (a gather one rank issues alone never completes). So do a
// checkpoint's save, which reads what this rank writes. From
// reduce_gradients() to spillway::step() (open_owner_step and
// close_owner_step: what the Python package's optimizer hooks and the
// engine call around every step, and what a C++ loop calls), and while an
// OwnerUses lives (spillway's optimizers, checkpoints), an op uses the
// parameters this rank owns in place, dropped group or not: their bytes
// are here. One that uses a parameter this rank dropped is refused: its
// bytes are on its owner alone. Such uses stamp nothing, so the window
// (above) sees the same uses on every rank. The optimizers step without
// autograd (torch's, spillway's, under no_grad), so the first op after
// reduce_gradients() that records autograd history ends the step: a step
// skipped on an fp16 overflow, which never reaches spillway::step(), ends
// at the next forward, on every rank at the same op. A forward under
// no_grad (an eval) cannot end it, since an optimizer's own ops look the
// same, so whatever skips a step ends the span itself: the engine calls
// spillway::step() on a skipped step too, and the Python package's
// GradScaler check closes it when any rank overflowed.
#include "hooks/torch/sharded_params.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "hooks/torch/client_names.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/gather_plan.h"
#include "hooks/torch/rank_layout.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

// A gather issued ahead of its use: the header exchange and the bytes.
struct GatherAhead {
  RowsInFlight header;
  GroupGather bytes;
};

struct ShardedModel {
  std::int64_t position = 0;  // among every model's layouts: the same on every rank
  std::string name;
  std::vector<ChunkGroup> groups;
  std::vector<bool> gathered;                // per group: counts towards kGatheredGroupsPerModel
  std::map<std::size_t, GatherAhead> ahead;  // by group: issued, not yet written
};

// What the step since the last boundary does with the plans (Note
// [Gathers issued ahead of their use]).
enum class Following { not_yet, plan, on_demand };
struct Interval {
  std::vector<GroupUse> recorded;
  bool overflowed = false;  // more than kMostRecordedUses
  Following following = Following::not_yet;
  const GatherPlan* plan = nullptr;
  std::size_t reached = 0;  // the plan's uses reached
  std::size_t issued = 0;   // the plan's gathers issued or done
};

// Uses recorded between two boundaries at most; a longer step gets no plan.
constexpr std::size_t kMostRecordedUses = std::size_t{1} << 18;
// Plans kept (Note [Steps that begin alike and part later] in
// gather_plan.cc): a training step, an eval, an actor's and a critic's.
constexpr std::size_t kMostPlans = 8;

// Guarded by the collectives' turn.
struct ShardedState {
  std::map<ClientId, ShardedModel> models;
  GatherPlans plans{kMostPlans, kGatheredGroupsPerModel};
  Interval interval;
};

ShardedState& sharded_state() {
  static ShardedState* const state = new ShardedState();  // never destroyed
  return *state;
}

// Orders the uses of parameters: the op hook stamps each op's.
std::atomic<std::uint64_t> use_clock{0};
std::atomic<std::int64_t> gathers{0};
std::atomic<std::int64_t> gathers_ahead{0};

// Whether the last drop_gathered sharded the parameter: one its owner
// stepped then. Not stepped_by_owner, which a parameter frozen since then
// no longer is, though its bytes are still on its owner alone.
bool sharded(const ManagedParam& managed) {
  return managed.shard_group.load(std::memory_order_acquire) >= 0;
}

// Calls `visit` with each sharded parameter of `chunk_group` but those of
// rank `except`'s member: with `except` a rank, the parameters it drops.
template <typename Visit>
void for_each_sharded(const ChunkGroup& chunk_group, int except, Visit visit) {
  for (std::size_t j = 0; j < chunk_group.members.size(); ++j) {
    if (static_cast<int>(j) == except) continue;
    for (const auto& managed : chunk_group.members[j])
      if (sharded(*managed)) visit(*managed);
  }
}
constexpr int kEveryMember = -1;

// A group's state is the same on every rank, so its flags are on every
// member's parameters, the owned ones too: a use of a dropped group is a
// collective on every rank, the owner's included.
void mark_dropped(const ChunkGroup& chunk_group, bool dropped) {
  for_each_sharded(chunk_group, kEveryMember, [&](ManagedParam& managed) {
    managed.shard_dropped.store(dropped, std::memory_order_release);
  });
}

std::string model_at(const ShardedState& state, std::int64_t position) {
  for (const auto& [client, model] : state.models)
    if (model.position == position) return fmt::format("model '{}'", model.name);
  return fmt::format("model #{} of this rank's {}", position, state.models.size());
}

// Note [Uses only the owner makes]
std::atomic<int> owner_uses{0};
std::atomic<bool> owner_step_open{false};

bool only_owner_uses() {
  return owner_uses.load(std::memory_order_acquire) > 0 ||
         owner_step_open.load(std::memory_order_acquire);
}

// Note [Uses only the owner makes]: throws when the op uses a parameter
// this rank dropped.
void use_owned_in_place(std::span<ManagedParam* const> params) {
  for (const ManagedParam* managed : params) {
    if (!sharded(*managed) || !managed->shard_dropped.load(std::memory_order_acquire) ||
        managed->shard_owned.load(std::memory_order_acquire))
      continue;
    ChunkManager& chunks = active_chunk_manager();
    throw std::runtime_error(fmt::format(
        "spillway data parallel (dist_params:sharded): an op reads '{}' of model '{}', which this "
        "rank dropped, while only the owners' uses run (an optimizer's step, from "
        "reduce_gradients() to spillway::step(), or a checkpoint's save): its bytes are on its "
        "owner alone until an op after spillway::step() gathers them",
        tensor_name(chunks, managed->param_id), client_name(managed->client)));
  }
}

// The header exchange before a gather (Note [Parameters gathered for their
// use]).
constexpr std::string_view kComparingGroups = "comparing the groups the ranks gather";

at::Tensor header_of(const ShardedModel& model, std::size_t index) {
  return at::tensor({model.position, static_cast<std::int64_t>(index)}, at::kLong);
}

// `all`: every rank's header.
void check_every_rank_gathers(c10d::ProcessGroup& group, const ShardedModel& model,
                              std::size_t index, const at::Tensor& all) {
  const auto group_index = static_cast<std::int64_t>(index);
  for (int rank = 0; rank < group.getSize(); ++rank) {
    const std::int64_t position = all[rank][0].item<std::int64_t>();
    const std::int64_t other = all[rank][1].item<std::int64_t>();
    if (position == model.position && other == group_index) continue;
    const bool a_gather = std::ranges::any_of(sharded_state().models, [&](const auto& entry) {
      return entry.second.position == position && other >= 0 &&
             other < static_cast<std::int64_t>(entry.second.groups.size());
    });
    // Another collective's bytes read as a header: that rank is elsewhere.
    if (!a_gather)
      throw std::runtime_error(fmt::format(
          "spillway data parallel (dist_params:sharded): rank {} gathers chunk group {} of "
          "model '{}' for an op, while rank {} is in another collective, not a gather of "
          "parameters: it does not use them at this point. With sharded parameters every use "
          "of a dropped group is a collective, so every rank must use the same parameters in "
          "the same order (a state_dict() or a read of a parameter on one rank alone breaks "
          "that); train such a model with dist_params:replicated",
          group.getRank(), index, model.name, rank));
    throw std::runtime_error(fmt::format(
        "spillway data parallel (dist_params:sharded): rank {} gathers chunk group {} of model "
        "'{}' for an op, while rank {} gathers chunk group {} of {}. With sharded parameters "
        "every use of a dropped group is a collective, so every rank must use the same "
        "parameters in the same order, as FSDP asks of its modules; a layer some ranks' "
        "micro-batches skip breaks that. Train such a model with dist_params:replicated",
        group.getRank(), index, model.name, rank, other, model_at(sharded_state(), position)));
  }
}

// Marks the group present and writes its bytes with `write`; dropped again
// if that fails, so no op computes on bytes that did not arrive.
template <typename Write>
void make_gathered(ShardedModel& model, std::size_t index, Write write) {
  const ChunkGroup& chunk_group = model.groups[index];
  mark_dropped(chunk_group, false);
  model.gathered[index] = true;
  gathers.fetch_add(1, std::memory_order_relaxed);
  try {
    write();
  } catch (...) {
    mark_dropped(chunk_group, true);
    model.gathered[index] = false;
    throw;
  }
}

void gather(c10d::ProcessGroup& group, ShardedModel& model, std::size_t index) {
  check_every_rank_gathers(group, model, index,
                           all_gather_rows(group, header_of(model, index), kComparingGroups));
  make_gathered(model, index, [&] { gather_chunk_group(group, model.groups[index], sharded); });
}

void start_gather_ahead(c10d::ProcessGroup& group, ShardedModel& model, std::size_t index) {
  RowsInFlight header = start_all_gather_rows(group, header_of(model, index), kComparingGroups);
  GroupGather bytes = start_group_gather(group, model.groups[index], sharded);
  model.ahead.emplace(index, GatherAhead{std::move(header), std::move(bytes)});
  gathers_ahead.fetch_add(1, std::memory_order_relaxed);
}

void finish_gather_ahead(c10d::ProcessGroup& group, ShardedModel& model, std::size_t index) {
  auto started = model.ahead.extract(index);
  check_every_rank_gathers(group, model, index, started.mapped().header.wait());
  make_gathered(model, index, [&] { started.mapped().bytes.finish(group.getRank()); });
}

// Finishes a gather issued ahead, or gathers; nothing when present.
void make_present(c10d::ProcessGroup& group, ShardedModel& model, std::size_t index) {
  if (model.ahead.contains(index))
    finish_gather_ahead(group, model, index);
  else if (!model.gathered[index])
    gather(group, model, index);
}

void drop(ChunkManager& chunks, ShardedModel& model, std::size_t index, int rank) {
  model.gathered[index] = false;
  mark_dropped(model.groups[index], true);
  for_each_sharded(model.groups[index], rank, [&](ManagedParam& managed) {
    if (chunks.discard(managed.param_id) != Status::ok)
      throw std::runtime_error(fmt::format(
          "spillway data parallel (dist_params:sharded): dropping '{}' of model '{}', which "
          "rank {} does not own, failed: {}",
          tensor_name(chunks, managed.param_id), model.name, rank, ChunkManager::last_error()));
  });
}

// Whether an op running on this thread holds one of the group's parameters
// (on every rank alike: the owned ones count too).
bool held(ChunkManager& chunks, const ChunkGroup& chunk_group) {
  bool in_compute = false;
  for_each_sharded(chunk_group, kEveryMember, [&](const ManagedParam& managed) {
    const std::optional<TensorInfo> info = chunks.tensor_info(managed.param_id);
    in_compute = in_compute || (info.has_value() && info->state == TensorState::compute);
  });
  return in_compute;
}

// A planned drop (a plan's, or a switch's): a group an op on this thread
// holds stays, on every rank alike.
void drop_unless_held(ChunkManager& chunks, ShardedModel& model, std::size_t index, int rank) {
  if (model.gathered[index] && !held(chunks, model.groups[index])) drop(chunks, model, index, rank);
}

std::uint64_t last_use(const ChunkGroup& chunk_group) {
  std::uint64_t last = 0;
  for_each_sharded(chunk_group, kEveryMember, [&](const ManagedParam& managed) {
    last = std::max(last, managed.last_use.load(std::memory_order_relaxed));
  });
  return last;
}

// Drops the groups used longest ago until kGatheredGroupsPerModel are left, or
// none but `pinned` and held ones.
void keep_window(ChunkManager& chunks, ShardedModel& model, const std::set<std::size_t>& pinned,
                 int rank) {
  for (;;) {
    const auto count =
        static_cast<std::size_t>(std::count(model.gathered.begin(), model.gathered.end(), true));
    if (count <= kGatheredGroupsPerModel) return;
    std::optional<std::size_t> oldest;
    std::uint64_t oldest_use = 0;
    for (std::size_t index = 0; index < model.groups.size(); ++index) {
      if (!model.gathered[index] || pinned.contains(index) || held(chunks, model.groups[index]))
        continue;
      const std::uint64_t use = last_use(model.groups[index]);
      if (!oldest.has_value() || use < oldest_use) {
        oldest = index;
        oldest_use = use;
      }
    }
    if (!oldest.has_value()) return;
    drop(chunks, model, *oldest, rank);
  }
}

// Counts the data parallel operation once, before its first collective
// (Note [A failed collective names the missing ranks]).
struct Operation {
  c10d::ProcessGroup& group;
  bool begun = false;
  void begin() {
    if (!begun) begin_operation(group);
    begun = true;
  }
};

ShardedModel& model_at_position(ShardedState& state, std::int64_t position) {
  for (auto& [client, model] : state.models)
    if (model.position == position) return model;
  throw std::logic_error(fmt::format(
      "spillway data parallel (dist_params:sharded): no model at position {}", position));
}

// The op's sharded groups.
GroupUse groups_of(const ShardedState& state, std::span<ManagedParam* const> params) {
  GroupUse use;
  for (const ManagedParam* managed : params) {
    const std::int32_t index = managed->shard_group.load(std::memory_order_acquire);
    if (index < 0) continue;
    const auto found = state.models.find(managed->client);
    if (found == state.models.end())
      throw std::logic_error(
          "spillway data parallel (dist_params:sharded): a sharded parameter's model is unknown");
    use.push_back(GroupKey{found->second.position, index});
  }
  std::ranges::sort(use);
  use.erase(std::unique(use.begin(), use.end()), use.end());
  return use;
}

void record(Interval& interval, const GroupUse& use) {
  if (!interval.recorded.empty() && interval.recorded.back() == use) return;
  if (interval.recorded.size() >= kMostRecordedUses) {
    interval.overflowed = true;
    return;
  }
  interval.recorded.push_back(use);
}

// The plan's use `at`: the previous use's drops, this one's groups made
// present, and the next gathers issued ahead.
void reach(Operation& operation, ShardedState& state, std::size_t at) {
  Interval& interval = state.interval;
  const GatherPlan& plan = *interval.plan;
  ChunkManager& chunks = active_chunk_manager();
  const int rank = operation.group.getRank();
  // A planned use's drops of groups it uses wait for the next use; the
  // window's drops of others come before its op, as the plan counts them.
  const auto drop_planned = [&](const PlannedUse& planned, bool of_its_own) {
    for (const GroupKey& key : planned.drops) {
      if (std::ranges::binary_search(planned.groups, key) != of_its_own) continue;
      ShardedModel& model = model_at_position(state, key.model);
      drop_unless_held(chunks, model, static_cast<std::size_t>(key.group), rank);
    }
  };
  if (at > 0) drop_planned(plan.uses[at - 1], /*of_its_own=*/true);
  for (const GroupKey& key : plan.uses[at].groups) {
    ShardedModel& model = model_at_position(state, key.model);
    const auto index = static_cast<std::size_t>(key.group);
    if (!model.gathered[index] && !model.ahead.contains(index)) operation.begin();
    make_present(operation.group, model, index);
  }
  drop_planned(plan.uses[at], /*of_its_own=*/false);
  interval.issued = std::max(interval.issued, plan.uses[at].gathers_through);
  while (interval.issued < plan.gathers.size() &&
         interval.issued < plan.uses[at].gathers_through + kGathersAhead) {
    const GroupKey& key = plan.gathers[interval.issued];
    // Only the models this op uses: another may be gone by the time of its
    // use, on some ranks sooner than on others (Note [A parameter only the
    // bridge holds goes] in dropped_params.cc), and its gather would not match.
    if (std::ranges::none_of(plan.uses[at].groups,
                             [&](const GroupKey& used) { return used.model == key.model; }))
      break;
    ShardedModel& model = model_at_position(state, key.model);
    const auto index = static_cast<std::size_t>(key.group);
    // Still present until a drop ahead: issued at a later use.
    if (model.gathered[index] || model.ahead.contains(index)) break;
    operation.begin();
    start_gather_ahead(operation.group, model, index);
    ++interval.issued;
  }
}

void finish_every_gather_ahead(Operation& operation, ShardedState& state) {
  for (auto& [client, model] : state.models)
    while (!model.ahead.empty())
      finish_gather_ahead(operation.group, model, model.ahead.begin()->first);
}

// Switching to another plan (Note [Steps that begin alike and part later]
// in gather_plan.cc): what it would not hold is dropped.
void keep_only(ShardedState& state, const GroupUse& present, int rank) {
  ChunkManager& chunks = active_chunk_manager();
  for (auto& [client, model] : state.models)
    for (std::size_t index = 0; index < model.groups.size(); ++index)
      if (!std::ranges::binary_search(present,
                                      GroupKey{model.position, static_cast<std::int64_t>(index)}))
        drop_unless_held(chunks, model, index, rank);
}

// Note [Gathers issued ahead of their use]: whether the plan served the op
// (false: gather on demand).
bool follow_plan(Operation& operation, ShardedState& state, const GroupUse& use) {
  Interval& interval = state.interval;
  if (interval.following == Following::not_yet) {
    interval.plan = state.plans.beginning_with(use);
    interval.following = interval.plan == nullptr ? Following::on_demand : Following::plan;
  }
  if (interval.following != Following::plan) return false;
  const GatherPlan& plan = *interval.plan;
  if (interval.reached < plan.uses.size() && plan.uses[interval.reached].groups == use) {
    reach(operation, state, interval.reached++);
    return true;
  }
  if (interval.reached > 0 && plan.uses[interval.reached - 1].groups == use) return true;
  // What is in flight is finished, and kept.
  finish_every_gather_ahead(operation, state);
  const GatherPlan* other =
      interval.reached > 0 ? state.plans.parting_with(plan, interval.reached, use) : nullptr;
  if (other != nullptr) {
    interval.plan = other;
    interval.issued = 0;
    keep_only(state, present_at(*other, interval.reached - 1), operation.group.getRank());
    reach(operation, state, interval.reached++);
    return true;
  }
  // Departs: the rest of the step gathers on demand.
  interval.following = Following::on_demand;
  return false;
}

// The window's gathers: each dropped group of the op's `use`, then drops
// beyond the window by last use, never of the op's own groups.
void gather_on_demand(Operation& operation, ShardedState& state, const GroupUse& use) {
  ChunkManager& chunks = active_chunk_manager();
  const int rank = operation.group.getRank();
  // `use` is sorted by model: one model's groups at a time, in one order on
  // every rank.
  std::map<std::int64_t, std::set<std::size_t>> used;
  for (const GroupKey& key : use) used[key.model].insert(static_cast<std::size_t>(key.group));
  operation.begin();
  for (const auto& [position, indices] : used) {
    ShardedModel& model = model_at_position(state, position);
    for (const std::size_t index : indices)
      if (!model.gathered.at(index)) gather(operation.group, model, index);
    keep_window(chunks, model, indices, rank);
  }
}

}  // namespace

bool parameters_sharded(c10d::ProcessGroup& group) {
  return group.getSize() > 1 && Runtime::process().config().dist_params == DistParams::sharded;
}

void gather_for_op(std::span<ManagedParam* const> params) {
  // Replicated, or none of the op's parameters sharded: nothing to do.
  if (std::ranges::none_of(params, [](const ManagedParam* managed) { return sharded(*managed); }))
    return;
  if (only_owner_uses()) {
    // An op that records autograd history is a forward, never an
    // optimizer's step (Note [Uses only the owner makes]).
    const bool forward =
        at::GradMode::is_enabled() && owner_uses.load(std::memory_order_acquire) == 0;
    if (!forward) {
      use_owned_in_place(params);
      return;
    }
    close_owner_step();
  }
  const std::uint64_t now = use_clock.fetch_add(1, std::memory_order_relaxed) + 1;
  const ManagedParam* dropped = nullptr;
  for (ManagedParam* managed : params) {
    if (!sharded(*managed)) continue;
    managed->last_use.store(now, std::memory_order_relaxed);
    if (managed->shard_dropped.load(std::memory_order_acquire)) dropped = managed;
  }
  // An op of a collective itself (a broadcast's copy): not a use.
  if (TurnLock::held_by_this_thread()) {
    if (dropped == nullptr) return;
    throw std::logic_error(fmt::format(
        "spillway data parallel (dist_params:sharded): an op inside a data parallel collective "
        "uses '{}', whose chunk group is dropped",
        tensor_name(active_chunk_manager(), dropped->param_id)));
  }
  CollectivesTurn turn = take_collectives_turn();
  if (!turn.group) {
    if (dropped == nullptr) return;
    throw std::logic_error(
        "spillway data parallel (dist_params:sharded): an op uses a parameter this rank dropped, "
        "and no data parallel group is set to gather it from");
  }
  ShardedState& state = sharded_state();
  Operation operation{*turn.group};
  const GroupUse use = groups_of(state, params);
  record(state.interval, use);
  if (follow_plan(operation, state, use)) return;
  if (dropped == nullptr) return;
  gather_on_demand(operation, state, use);
}

void end_interval(c10d::ProcessGroup& group) {
  ShardedState& state = sharded_state();
  for (auto& [client, model] : state.models) {
    for (auto& [index, started] : model.ahead) {
      started.header.wait();
      started.bytes.abandon();
    }
    model.ahead.clear();
  }
  Interval& interval = state.interval;
  if (!state.models.empty()) {
    const bool followed =
        interval.following == Following::plan && interval.reached == interval.plan->uses.size();
    const std::uint64_t print = fingerprint(interval.recorded);
    const at::Tensor all = all_gather_rows(
        group,
        at::tensor(
            {static_cast<std::int64_t>(print), static_cast<std::int64_t>(interval.recorded.size()),
             static_cast<std::int64_t>(followed), static_cast<std::int64_t>(interval.overflowed)},
            at::kLong),
        "comparing the ranks' uses of parameters");
    bool adopt = false;
    bool overflowed = false;
    for (int rank = 0; rank < group.getSize(); ++rank) {
      if (all[rank][0].item<std::int64_t>() != all[0][0].item<std::int64_t>() ||
          all[rank][1].item<std::int64_t>() != all[0][1].item<std::int64_t>())
        throw std::runtime_error(fmt::format(
            "spillway data parallel (dist_params:sharded): since the last step boundary rank {} "
            "used sharded parameters differently from rank 0 ({} uses of chunk groups against "
            "{}, and not the same ones). With sharded parameters every rank must use the same "
            "parameters in the same order, as FSDP asks of its modules: an op on a parameter on "
            "one rank alone (a log of a weight's norm on rank 0, say) breaks that. Train such a "
            "model with dist_params:replicated",
            rank, all[rank][1].item<std::int64_t>(), all[0][1].item<std::int64_t>()));
      adopt = adopt || all[rank][2].item<std::int64_t>() == 0;
      overflowed = overflowed || all[rank][3].item<std::int64_t>() != 0;
    }
    if (!adopt) {
      state.plans.followed(interval.plan);  // every rank followed it to its end
    } else if (!overflowed && !interval.recorded.empty()) {
      state.plans.keep(interval.recorded);
    }
  }
  interval = Interval{};
}

void gather_frozen_since_dropped(c10d::ProcessGroup& group) {
  for (auto& [client, model] : sharded_state().models)
    for (std::size_t index = 0; index < model.groups.size(); ++index) {
      if (model.gathered[index]) continue;
      bool frozen = false;
      for_each_sharded(model.groups[index], kEveryMember, [&](const ManagedParam& managed) {
        frozen = frozen || !stepped_by_owner(managed);
      });
      if (frozen) gather(group, model, index);
    }
}

void drop_gathered(ChunkManager& chunks, c10d::ProcessGroup& group, std::optional<ClientId> only) {
  const int rank = group.getRank();
  const std::vector<RankLayout> layouts = rank_layouts(chunks, group.getSize());
  ShardedState& state = sharded_state();
  std::set<ClientId> present;
  bool moved = false;  // a model came, went or changed position: the plans name others
  for (std::size_t position = 0; position < layouts.size(); ++position) {
    const RankLayout& layout = layouts[position];
    present.insert(layout.client);
    const auto known = state.models.find(layout.client);
    moved = moved || known == state.models.end() ||
            known->second.position != static_cast<std::int64_t>(position);
    if (only.has_value() && layout.client != *only) {
      if (known != state.models.end()) known->second.position = static_cast<std::int64_t>(position);
      continue;
    }
    ShardedModel& model = state.models[layout.client];
    model = ShardedModel{static_cast<std::int64_t>(position), layout.client_name, layout.groups,
                         std::vector<bool>(layout.groups.size(), false)};
    for (std::size_t index = 0; index < model.groups.size(); ++index)
      for (const auto& member : model.groups[index].members)
        for (const auto& managed : member) {
          const bool stepped = stepped_by_owner(*managed);
          managed->shard_group.store(stepped ? static_cast<std::int32_t>(index) : -1,
                                     std::memory_order_release);
          managed->shard_owned.store(
              &member == &model.groups[index].members[static_cast<std::size_t>(rank)],
              std::memory_order_release);
          if (!stepped) managed->shard_dropped.store(false, std::memory_order_release);
        }
    for (std::size_t index = 0; index < model.groups.size(); ++index)
      drop(chunks, model, index, rank);
  }
  moved = moved || state.models.size() != present.size();
  std::erase_if(state.models, [&](const auto& entry) { return !present.contains(entry.first); });
  if (moved) state.plans.clear();
}

std::int64_t parameter_gathers() { return gathers.load(std::memory_order_relaxed); }
std::int64_t parameter_gathers_ahead() { return gathers_ahead.load(std::memory_order_relaxed); }

OwnerUses::OwnerUses() { owner_uses.fetch_add(1, std::memory_order_acq_rel); }
OwnerUses::~OwnerUses() { owner_uses.fetch_sub(1, std::memory_order_acq_rel); }
void open_owner_step() { owner_step_open.store(true, std::memory_order_release); }
void close_owner_step() { owner_step_open.store(false, std::memory_order_release); }

void gather_everything_dropped() {
  CollectivesTurn turn = take_collectives_turn();
  ShardedState& state = sharded_state();
  if (!turn.group || state.models.empty()) return;
  begin_operation(*turn.group);
  for (auto& [client, model] : state.models) {
    for (std::size_t index = 0; index < model.groups.size(); ++index)
      make_present(*turn.group, model, index);
    for (const ChunkGroup& chunk_group : model.groups)
      for_each_sharded(chunk_group, kEveryMember, [](ManagedParam& managed) {
        managed.shard_group.store(-1, std::memory_order_release);
      });
  }
  state.models.clear();
  state.plans.clear();
  state.interval = Interval{};
}

}  // namespace spillway::torch_bridge

namespace spillway {

ParameterChunkBytes parameter_chunk_bytes() {
  ParameterChunkBytes bytes;
  if (torch_bridge::binding_table().empty()) return bytes;
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  std::set<ClientId> models;
  for (const auto& managed : torch_bridge::binding_table().managed_params())
    models.insert(managed->client);
  for (const ClientId model : models)
    for (const ChunkId chunk : chunks.chunks_of(model)) {
      const std::optional<ChunkInfo> info = chunks.chunk_info(chunk);
      if (!info.has_value() || info->kind != TensorKind::param) continue;
      bytes.total += info->capacity_bytes;
      if (info->location != Location::none) bytes.held += info->capacity_bytes;
    }
  return bytes;
}

}  // namespace spillway
