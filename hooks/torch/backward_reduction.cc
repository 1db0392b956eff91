// Reducing gradients across ranks while backward runs.
//
// Note [Reducing while backward runs]
// A chunk group's gradients can go to their owners as soon as this backward
// has written all of them: the collective (Gloo's threads, NCCL's stream)
// then runs while backward computes the rest, instead of after it. The
// ranks must still issue the same collectives in the same order, and when a
// group completes depends on each rank's micro-batch and timing. So the
// order is fixed by the layout every rank agreed on: the models in the order
// they were added, each one's chunk groups last first (backward produces
// gradients roughly in the reverse of the order forward used the
// parameters, the order they were placed in chunks). A group is reduced
// once all its gradients are written and every group before it in the order
// has been reduced; whatever waits is reduced at the end of backward.
//  - Which gradients this backward will write is known when it starts: the
//    parameters whose gradient accumulator is among the graph task's nodes
//    (and, for a backward with `inputs`, is to run). The first hook reads
//    them, so the models this backward reaches are known, and a group's
//    gradients are all written when the accumulation post hook
//    (grad_binding.cc) of each of those parameters in it has run: autograd
//    runs it once per backward, after the last contribution. A parameter
//    this rank's micro-batch does not reach does not hold its group back.
//  - Only the models this backward reaches are in the order, so a model
//    added later than one it does not reach (a critic's backward) overlaps
//    as well.
//  - At the end of backward (an autograd final callback, queued by the first
//    hook), every group not yet reduced of every model this backward reached
//    is reduced, in the same order. After a backward that ran to the end
//    nothing is left; it is the rule that keeps the ranks' sequences equal
//    should autograd's graph not say (another engine, say: every parameter
//    then counts as expected, and the models as the hooks reach them).
//  - Every rank's backward must reach the same models, though not the same
//    parameters (DDP asks as much of its modules): a model one rank's
//    backward reaches and another's does not would be reduced on one side
//    only, and the ranks' collectives would no longer match. So the
//    backward's first collectives compare the layouts and then the models
//    each rank's backward reaches, and ranks that differ all fail there,
//    naming the model. (A rank whose backward reaches no managed model at
//    all takes no part; the others' first collective then fails at the
//    group's timeout, naming it: Note [A failed collective names the
//    missing ranks].)
//  - One group's collective is in flight at a time: the next group waits for
//    it before starting, so staging memory stays one group's, as when the
//    reduction followed backward. What other ranks own is dropped as soon as
//    it is sent, during backward.
//  - Inside no_sync() (the micro-batches of an accumulation window but the
//    last) backward only accumulates; the last backward reduces what all of
//    them wrote, and reduce_gradients() (the optimizer's pre-hook) whatever
//    models the last did not reach.
//  - A backward that fails part way leaves its state behind; the next
//    backward (another graph task) starts afresh. A backward nested in a
//    backward (reentrant activation checkpointing) is another graph task
//    too, so it is not supported under data parallel training.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include "hooks/torch/data_parallel.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

std::atomic<int> no_sync_depth{0};

// One chunk group in the order of reduction.
struct Slot {
  std::size_t layout = 0;
  std::size_t group = 0;
  int unwritten = 0;  // its stepped parameters whose gradient this backward has not written
};

// One backward's reduction; guarded by the collectives' turn.
struct BackwardReduction {
  bool active = false;
  bool graph_known = false;  // reached comes from autograd's graph, not the hooks
  int graph_task = -1;
  std::vector<RankLayout> layouts;
  std::vector<bool> reached;  // per layout: this backward wrote one of its gradients
  std::vector<Slot> order;
  std::unordered_map<const ManagedParam*, std::size_t> slot_of;  // until written
  std::size_t next = 0;                                          // the first slot not reduced
  bool begun = false;  // the operation counted and the layouts compared
  GroupReduction in_flight;
  std::optional<std::size_t> in_flight_slot;
};

BackwardReduction& backward_reduction() {
  static BackwardReduction* const state = new BackwardReduction();  // never destroyed
  return *state;
}

// Whether the current graph task will run `managed`'s gradient accumulator,
// and so its post hook. `in_graph`: the task's nodes.
bool runs_accumulator(const ManagedParam& managed,
                      const std::unordered_set<torch::autograd::Node*>& in_graph) {
  torch::autograd::Node* node = managed.grad_accumulator.get();
  if (node == nullptr || !in_graph.contains(node)) return false;
  // Empty for a plain backward (torch/csrc/autograd/graph_task.h, its exec info note).
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || exec_info->empty()) return true;
  const auto found = exec_info->find(node);
  return found != exec_info->end() && found->second.should_execute();
}

void start_backward(BackwardReduction& state, c10d::ProcessGroup& group, int graph_task) {
  state = BackwardReduction{};
  state.active = true;
  state.graph_task = graph_task;
  state.layouts = rank_layouts(active_chunk_manager(), group.getSize());
  state.reached.assign(state.layouts.size(), false);
  // Null where autograd does not say: every parameter is then expected.
  const std::unordered_set<torch::autograd::Node*>* in_graph =
      torch::autograd::get_current_graph_task_nodes_in_graph();
  state.graph_known = in_graph != nullptr;
  for (std::size_t l = 0; l < state.layouts.size(); ++l) {
    const std::vector<ChunkGroup>& groups = state.layouts[l].groups;
    const std::size_t first_slot = state.order.size();
    for (std::size_t g = groups.size(); g-- > 0;) {
      Slot slot{l, g, 0};
      for (const auto& member : groups[g].members)
        for (const auto& managed : member) {
          if (!stepped_by_owner(*managed)) continue;
          if (in_graph != nullptr) {
            if (!runs_accumulator(*managed, *in_graph)) continue;
            state.reached[l] = true;
          }
          state.slot_of.emplace(managed.get(), state.order.size());
          ++slot.unwritten;
        }
      state.order.push_back(slot);
    }
    if (in_graph != nullptr && !state.reached[l])
      state.order.resize(first_slot);  // not reached: not in the order
  }
}

void finish_in_flight(BackwardReduction& state) {
  if (!state.in_flight_slot) return;
  const Slot& slot = state.order[*state.in_flight_slot];
  state.in_flight_slot.reset();
  GroupReduction reduction = std::move(state.in_flight);
  state.in_flight = GroupReduction();
  reduction.finish();
  mark_gradients_reduced(state.layouts[slot.layout].groups[slot.group]);
}

// Throws, on every rank alike, when the ranks' backwards reach different
// models (a collective).
void check_same_models_reached(c10d::ProcessGroup& group, const BackwardReduction& state) {
  const auto count = static_cast<std::int64_t>(state.layouts.size());
  at::Tensor mine = at::zeros({count}, at::kLong);
  for (std::int64_t l = 0; l < count; ++l)
    mine[l] = state.reached[static_cast<std::size_t>(l)] ? 1 : 0;
  const at::Tensor all =
      all_gather_rows(group, mine, "comparing the models each rank's backward reaches");
  for (std::int64_t l = 0; l < count; ++l) {
    std::vector<int> reaching, not_reaching;
    for (int rank = 0; rank < group.getSize(); ++rank)
      (all[rank][l].item<std::int64_t>() != 0 ? reaching : not_reaching).push_back(rank);
    if (reaching.empty() || not_reaching.empty()) continue;
    throw std::runtime_error(fmt::format(
        "spillway data parallel: the backward of rank(s) {} reaches model '{}' and that of "
        "rank(s) {} does not. Every rank's backward must reach the same models (their "
        "parameters may differ), since each model's gradients are reduced across all ranks",
        fmt::join(reaching, ", "), state.layouts[static_cast<std::size_t>(l)].client_name,
        fmt::join(not_reaching, ", ")));
  }
}

void reduce_slot(BackwardReduction& state, c10d::ProcessGroup& group, std::size_t index) {
  if (!state.begun) {
    begin_operation(group);
    check_layouts_agree(group, state.layouts);
    if (state.graph_known) check_same_models_reached(group, state);
    state.begun = true;
  }
  finish_in_flight(state);
  const Slot& slot = state.order[index];
  state.in_flight = start_group_reduction(active_chunk_manager(), group,
                                          state.layouts[slot.layout].groups[slot.group]);
  state.in_flight_slot = index;
}

// Reduces the slots from `next` on that are ready, in order.
void reduce_ready(BackwardReduction& state, c10d::ProcessGroup& group) {
  while (state.next < state.order.size()) {
    const Slot& slot = state.order[state.next];
    if (!state.reached[slot.layout] || slot.unwritten > 0) return;
    reduce_slot(state, group, state.next++);
  }
}

// The end of the backward: every group left of every model it reached.
void reduce_the_rest(int graph_task) {
  CollectivesTurn turn = take_collectives_turn();
  BackwardReduction& state = backward_reduction();
  if (!state.active || state.graph_task != graph_task) return;
  try {
    if (turn.group) {
      for (; state.next < state.order.size(); ++state.next)
        if (state.reached[state.order[state.next].layout])
          reduce_slot(state, *turn.group, state.next);
      finish_in_flight(state);
    }
  } catch (...) {
    state = BackwardReduction{};
    throw;
  }
  state = BackwardReduction{};
}

}  // namespace

void reduce_as_backward_completes(const ManagedParam& managed) {
  if (no_sync_depth.load(std::memory_order_acquire) > 0) return;
  CollectivesTurn turn = take_collectives_turn();
  if (!turn.group) return;
  BackwardReduction& state = backward_reduction();
  const int graph_task = torch::autograd::get_current_graph_task_id();
  try {
    if (!state.active || state.graph_task != graph_task) {
      start_backward(state, *turn.group, graph_task);
      torch::autograd::Engine::get_default_engine().queue_callback(
          [graph_task] { reduce_the_rest(graph_task); });
    }
    const auto found = state.slot_of.find(&managed);
    if (found == state.slot_of.end()) return;  // managed since this backward began
    Slot& slot = state.order[found->second];
    state.slot_of.erase(found);
    state.reached[slot.layout] = true;
    --slot.unwritten;
    reduce_ready(state, *turn.group);
  } catch (...) {
    state = BackwardReduction{};
    throw;
  }
}

}  // namespace spillway::torch_bridge

namespace spillway {

NoSync::NoSync() { torch_bridge::no_sync_depth.fetch_add(1, std::memory_order_acq_rel); }

NoSync::~NoSync() { torch_bridge::no_sync_depth.fetch_sub(1, std::memory_order_acq_rel); }

}  // namespace spillway
