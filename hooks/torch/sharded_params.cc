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
//    sides, and it reads as zeros until a gather writes it through the
//    op hooks, like any write. A group is marked gathered before its bytes
//    are written (the writes are ops on its parameters) and dropped again
//    if the gather fails, so no op computes on bytes that did not arrive.
//  - An op waits for its gather: issuing gathers ahead of use, from the
//    traced step, is not built (docs/data-parallel.md).
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
#include "hooks/torch/rank_layout.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

struct ShardedModel {
  std::int64_t position = 0;  // among every model's layouts: the same on every rank
  std::string name;
  std::vector<ChunkGroup> groups;
  std::vector<bool> gathered;  // per group: counts towards kGatheredGroupsPerModel
};

// Guarded by the collectives' turn.
struct ShardedState {
  std::map<ClientId, ShardedModel> models;
};

ShardedState& sharded_state() {
  static ShardedState* const state = new ShardedState();  // never destroyed
  return *state;
}

// Orders the uses of parameters: the op hook stamps each op's.
std::atomic<std::uint64_t> use_clock{0};
std::atomic<std::int64_t> gathers{0};

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

std::string parameter_name(ChunkManager& chunks, const ManagedParam& managed) {
  const std::optional<TensorInfo> info = chunks.tensor_info(managed.param_id);
  return info.has_value() ? info->name : std::string("?");
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
        parameter_name(chunks, *managed), client_name(managed->client)));
  }
}

// The header exchange before a gather (Note [Parameters gathered for their
// use]).
void check_every_rank_gathers(c10d::ProcessGroup& group, const ShardedModel& model,
                              std::size_t index) {
  const auto group_index = static_cast<std::int64_t>(index);
  const at::Tensor all =
      all_gather_rows(group, at::tensor({model.position, group_index}, at::kLong),
                      "comparing the groups the ranks gather");
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

void gather(c10d::ProcessGroup& group, ShardedModel& model, std::size_t index) {
  const ChunkGroup& chunk_group = model.groups[index];
  check_every_rank_gathers(group, model, index);
  // Present before the bytes arrive: writing them takes ops on these very
  // parameters, whose hooks must not gather again.
  mark_dropped(chunk_group, false);
  model.gathered[index] = true;
  gathers.fetch_add(1, std::memory_order_relaxed);
  try {
    gather_chunk_group(group, chunk_group, sharded);
  } catch (...) {
    mark_dropped(chunk_group, true);
    model.gathered[index] = false;
    throw;
  }
}

void drop(ChunkManager& chunks, ShardedModel& model, std::size_t index, int rank) {
  model.gathered[index] = false;
  mark_dropped(model.groups[index], true);
  for_each_sharded(model.groups[index], rank, [&](ManagedParam& managed) {
    if (chunks.discard(managed.param_id) != Status::ok)
      throw std::runtime_error(fmt::format(
          "spillway data parallel (dist_params:sharded): dropping '{}' of model '{}', which "
          "rank {} does not own, failed: {}",
          parameter_name(chunks, managed), model.name, rank, ChunkManager::last_error()));
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
  if (dropped == nullptr) return;
  ChunkManager& chunks = active_chunk_manager();
  if (TurnLock::held_by_this_thread())
    throw std::logic_error(fmt::format(
        "spillway data parallel (dist_params:sharded): an op inside a data parallel collective "
        "uses '{}', whose chunk group is dropped",
        parameter_name(chunks, *dropped)));
  CollectivesTurn turn = take_collectives_turn();
  if (!turn.group)
    throw std::logic_error(
        "spillway data parallel (dist_params:sharded): an op uses a parameter this rank dropped, "
        "and no data parallel group is set to gather it from");
  ShardedState& state = sharded_state();
  const int rank = turn.group->getRank();
  // The op's groups, pinned against drops; in one order on every rank.
  std::map<ClientId, std::set<std::size_t>> used;
  for (ManagedParam* managed : params) {
    const std::int32_t index = managed->shard_group.load(std::memory_order_acquire);
    if (index >= 0) used[managed->client].insert(static_cast<std::size_t>(index));
  }
  begin_operation(*turn.group);
  for (const auto& [client, indices] : used) {
    const auto found = state.models.find(client);
    if (found == state.models.end())
      throw std::logic_error(
          "spillway data parallel (dist_params:sharded): a dropped parameter's model is unknown");
    ShardedModel& model = found->second;
    for (const std::size_t index : indices)
      if (!model.gathered.at(index)) gather(*turn.group, model, index);
    keep_window(chunks, model, indices, rank);
  }
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
  for (std::size_t position = 0; position < layouts.size(); ++position) {
    const RankLayout& layout = layouts[position];
    present.insert(layout.client);
    if (only.has_value() && layout.client != *only) continue;
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
  std::erase_if(state.models, [&](const auto& entry) { return !present.contains(entry.first); });
}

std::int64_t parameter_gathers() { return gathers.load(std::memory_order_relaxed); }

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
      if (!model.gathered[index]) gather(*turn.group, model, index);
    for (const ChunkGroup& chunk_group : model.groups)
      for_each_sharded(chunk_group, kEveryMember, [](ManagedParam& managed) {
        managed.shard_group.store(-1, std::memory_order_release);
      });
  }
  state.models.clear();
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
