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
//    them, and a group's gradients are all written when the accumulation
//    post hook (grad_binding.cc) of each of those parameters in it has run:
//    autograd runs it once per backward, after the last contribution. A
//    parameter this rank's micro-batch does not reach does not hold its
//    group back.
//  - The order is the groups that some rank's backward writes: when this
//    rank's first group is written, one small all-gather compares the
//    models each rank's backward reaches and which groups each writes; the
//    union, in the fixed order, is what every rank then reduces. So a model
//    added later than one the backward does not reach (a critic's
//    backward) overlaps as well, and a backward that writes few groups
//    reduces few.
//  - At the end of backward (an autograd final callback, queued by the first
//    hook), every group of the order not yet reduced is reduced. After a
//    backward that ran to the end nothing is left; it is the rule that keeps
//    the ranks' sequences equal should autograd's graph not say (another
//    engine, say: every parameter then counts as expected, every group of
//    every model is in the order, and the models count as reached as the
//    hooks reach them).
//  - Every rank's backward must reach the same models, though not the same
//    parameters (DDP asks as much of its modules): a model one rank's
//    backward reaches and another's does not would be reduced on one side
//    only. Ranks that differ all fail at that first all-gather, naming the
//    model. A rank whose backward reaches no managed model at all takes no
//    part, and its optimizer step's reduction meets theirs in that same
//    all-gather, where all of them fail, naming it (Note [What each rank
//    is reducing for]).
//  - Backwards nest: a reentrant activation checkpoint recomputes its
//    segment in its backward and runs a backward of its own through it,
//    another graph task, inside the outer one. Each running backward has
//    its own state (outermost first), its own order and its own end
//    callback. A reduction sends only what was written since the last and
//    leaves the owner's other gradients as they are (Note [A reduction
//    sends what backward wrote since the last] in data_parallel.cc), so
//    reducing a group twice is exact, but it sends the group twice. A
//    nested backward therefore reduces only the groups it writes whole on
//    every rank that writes them; a group it writes part of (its
//    parameters span segments) is deferred to the end of the outermost
//    backward, which reduces it once for all the segments that wrote it
//    (Note [Deferred to the outermost backward]). A parameter used both
//    inside and outside a checkpoint is written twice by one backward; the
//    second write, should it come while the first's reduction is in
//    flight, is refused (Note [No write to a gradient in flight],
//    data_parallel.cc).
//  - One group's collective is in flight at a time, whichever backward
//    started it: the next waits for it before starting, so staging memory
//    stays one group's. What other ranks own is dropped as soon as it is
//    sent, during backward.
//  - Inside no_sync() (the micro-batches of an accumulation window but the
//    last) backward only accumulates; the last backward reduces what all of
//    them wrote, and reduce_gradients() (the optimizer's pre-hook) whatever
//    groups the last did not write.
//  - A backward that fails part way never runs its end callback. Its state
//    goes when the next backward starts: the callback, which autograd
//    destroys with the graph task, holds the token that keeps the state
//    alive. An error in our own hooks clears every state.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
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

// One chunk group of a layout, a candidate for the order of reduction.
struct Slot {
  std::size_t layout = 0;
  std::size_t group = 0;
  int unwritten = 0;      // its stepped parameters whose gradient this backward has not written
  bool expected = false;  // this backward writes one of them
  bool whole = false;     // this backward writes all of them
};

// A chunk group by its model and index: the same across the states of
// nested backwards, each of which lays the models out anew.
struct ModelGroup {
  ClientId client{};
  std::size_t group = 0;
  bool operator==(const ModelGroup&) const = default;
};

// One backward's reduction (one graph task); guarded by the collectives' turn.
struct BackwardReduction {
  int graph_task = -1;
  bool graph_known = false;  // expected and reached come from autograd's graph, not the hooks
  std::vector<RankLayout> layouts;
  std::vector<bool> reached;  // per layout: this backward writes one of its gradients
  std::vector<Slot> slots;    // every layout's groups: layouts in order, groups last first
  std::unordered_map<const ManagedParam*, std::size_t> slot_of;  // until written
  std::vector<std::size_t> order;                                // the slots to reduce, in order
  std::size_t next = 0;                                          // the first of `order` not reduced
  bool begun = false;   // the operation counted, the ranks' expectations compared
  bool nested = false;  // began inside another backward (a reentrant checkpoint's)
  // Expires when autograd destroys the graph task (and the end callback,
  // which holds it): whether the backward still runs, ended or failed.
  std::weak_ptr<const void> task_alive;
};

// The backwards under way, outermost first: a reentrant checkpoint's
// backward runs nested in the one that reached it. One collective is in
// flight at a time, whichever backward started it.
struct BackwardReductions {
  std::vector<std::unique_ptr<BackwardReduction>> running;
  GroupReduction in_flight;
  // Note [Deferred to the outermost backward]: in the order the nested
  // backwards deferred them, the same on every rank.
  std::vector<ModelGroup> deferred;
};

BackwardReductions& backward_reductions() {
  static BackwardReductions* const state = new BackwardReductions();  // never destroyed
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

std::unique_ptr<BackwardReduction> start_backward(c10d::ProcessGroup& group, int graph_task,
                                                  bool nested) {
  auto state = std::make_unique<BackwardReduction>();
  state->graph_task = graph_task;
  state->nested = nested;
  state->layouts = rank_layouts(active_chunk_manager(), group.getSize());
  state->reached.assign(state->layouts.size(), false);
  // Null where autograd does not say: every parameter is then expected.
  const std::unordered_set<torch::autograd::Node*>* in_graph =
      torch::autograd::get_current_graph_task_nodes_in_graph();
  state->graph_known = in_graph != nullptr;
  for (std::size_t l = 0; l < state->layouts.size(); ++l) {
    const std::vector<ChunkGroup>& groups = state->layouts[l].groups;
    for (std::size_t g = groups.size(); g-- > 0;) {
      Slot slot{l, g, 0, false, false};
      int stepped = 0;
      for (const auto& member : groups[g].members)
        for (const auto& managed : member) {
          if (!stepped_by_owner(*managed)) continue;
          ++stepped;
          if (in_graph != nullptr) {
            if (!runs_accumulator(*managed, *in_graph)) continue;
            state->reached[l] = true;
          }
          state->slot_of.emplace(managed.get(), state->slots.size());
          ++slot.unwritten;
        }
      slot.expected = slot.unwritten > 0;
      slot.whole = slot.expected && slot.unwritten == stepped;
      state->slots.push_back(slot);
    }
  }
  // Without the graph, every group, as the hooks reach their models;
  // with it, the order comes from every rank's expectations (begin).
  if (!state->graph_known)
    for (std::size_t i = 0; i < state->slots.size(); ++i) state->order.push_back(i);
  return state;
}

void finish_in_flight(BackwardReductions& reductions) {
  std::exchange(reductions.in_flight, GroupReduction()).finish();
}

// Note [Deferred to the outermost backward]
// A reentrant checkpoint's backward (nested) writes the gradients of its
// segment only. Where a chunk group's parameters span segments, or a
// segment and the layers outside every checkpoint, each backward that
// writes some of them would send the whole group again. So a nested
// backward reduces a group only where every rank whose backward writes
// some of it writes all of it (the ranks' bits compared in the order's
// all-gather); the others go on a list that the end of the outermost
// backward reduces, after its own order, minus those reduced since they
// were deferred (the outer order reaches some: the first layer's group).
// The list changes only at collectives, in the order every rank issues
// them, so it is the same on every rank. What a deferred group loses is
// overlap: it is sent at the end of backward instead of during it.

}  // namespace

// Note [What each rank is reducing for]
// A rank whose backward reaches no managed model (its loss does not depend
// on one) takes no part in the others' reduction during backward, and goes
// on to its optimizer step, whose reduce_gradients() issues collectives of
// its own. The ranks would wait on collectives that do not match until the
// group's timeout (30 minutes by default) and then fail naming neither
// cause. So both begin the same way: the layouts compared (one all-gather
// over every model), then one all-gather of a row that starts with what
// the rank reduces for and is as long on both sides (a figure per model,
// two per chunk group). Ranks that differ all see it in that all-gather
// and raise at once, naming the ranks and the models.
at::Tensor all_gather_reducing_for(c10d::ProcessGroup& group, ReducingFor kind,
                                   const std::vector<RankLayout>& layouts,
                                   const std::vector<std::int64_t>& per_layout,
                                   const std::vector<std::int64_t>& per_slot) {
  std::int64_t slots = 0;
  for (const RankLayout& layout : layouts) slots += static_cast<std::int64_t>(layout.groups.size());
  const auto models = static_cast<std::int64_t>(layouts.size());
  if (per_layout.size() != layouts.size() ||
      (!per_slot.empty() && static_cast<std::int64_t>(per_slot.size()) != 2 * slots))
    throw std::logic_error("all_gather_reducing_for: a row of the wrong length");
  at::Tensor mine = at::zeros({1 + models + 2 * slots}, at::kLong);
  mine[0] = static_cast<std::int64_t>(kind);
  for (std::int64_t l = 0; l < models; ++l) mine[1 + l] = per_layout[static_cast<std::size_t>(l)];
  for (std::size_t i = 0; i < per_slot.size(); ++i)
    mine[1 + models + static_cast<std::int64_t>(i)] = per_slot[i];
  const at::Tensor all = all_gather_rows(group, mine, "comparing what each rank reduces for");
  std::vector<int> in_backward, in_step;
  std::vector<std::string> reached;
  for (int rank = 0; rank < group.getSize(); ++rank) {
    const bool backward =
        all[rank][0].item<std::int64_t>() == static_cast<std::int64_t>(ReducingFor::backward);
    (backward ? in_backward : in_step).push_back(rank);
    for (std::int64_t l = 0; backward && l < models; ++l) {
      const std::string& name = layouts[static_cast<std::size_t>(l)].client_name;
      if (all[rank][1 + l].item<std::int64_t>() != 0 &&
          std::ranges::find(reached, name) == reached.end())
        reached.push_back(name);
    }
  }
  if (!in_backward.empty() && !in_step.empty())
    throw std::runtime_error(fmt::format(
        "spillway data parallel: the backward of rank(s) {} reaches model(s) '{}', and rank(s) "
        "{} went on to reduce gradients for an optimizer step (reduce_gradients(), or a Python "
        "optimizer's step) without a backward that reached any. Every rank's backward must "
        "reach the same models, since each model's gradients are reduced across all ranks: "
        "give every rank a loss that depends on them",
        fmt::join(in_backward, ", "), fmt::join(reached, "', '"), fmt::join(in_step, ", ")));
  return all.narrow(1, 1, models + 2 * slots);
}

namespace {

// With the graph known: compares the models each rank's backward reaches
// (throwing, on every rank alike, when they differ) and orders the groups
// any rank's backward writes (a collective). A group no rank writes is
// left out; a nested backward defers what it writes in part (Note
// [Deferred to the outermost backward]).
void agree_on_order(c10d::ProcessGroup& group, BackwardReductions& reductions,
                    BackwardReduction& state) {
  const auto layouts = static_cast<std::int64_t>(state.layouts.size());
  const auto slots = static_cast<std::int64_t>(state.slots.size());
  std::vector<std::int64_t> per_layout, per_slot(2 * state.slots.size());
  for (const bool reached : state.reached) per_layout.push_back(reached ? 1 : 0);
  for (std::size_t i = 0; i < state.slots.size(); ++i) {
    const Slot& slot = state.slots[i];
    per_slot[i] = slot.expected ? 1 : 0;
    per_slot[state.slots.size() + i] = slot.expected && !slot.whole ? 1 : 0;
  }
  const at::Tensor all =
      all_gather_reducing_for(group, ReducingFor::backward, state.layouts, per_layout, per_slot);
  for (std::int64_t l = 0; l < layouts; ++l) {
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
  const at::Tensor anyone = all.narrow(1, layouts, slots).amax(0);
  const at::Tensor in_part = all.narrow(1, layouts + slots, slots).amax(0);
  for (std::int64_t i = 0; i < slots; ++i) {
    if (anyone[i].item<std::int64_t>() == 0) continue;
    const Slot& slot = state.slots[static_cast<std::size_t>(i)];
    if (state.nested && in_part[i].item<std::int64_t>() != 0) {
      const ModelGroup key{state.layouts[slot.layout].client, slot.group};
      if (std::ranges::find(reductions.deferred, key) == reductions.deferred.end())
        reductions.deferred.push_back(key);
      continue;
    }
    state.order.push_back(static_cast<std::size_t>(i));
  }
}

void begin(BackwardReductions& reductions, BackwardReduction& state, c10d::ProcessGroup& group) {
  if (state.begun) return;
  finish_in_flight(reductions);
  begin_operation(group);
  check_layouts_agree(group, state.layouts);
  if (state.graph_known) agree_on_order(group, reductions, state);
  state.begun = true;
}

void reduce_slot(BackwardReductions& reductions, BackwardReduction& state,
                 c10d::ProcessGroup& group, std::size_t index) {
  begin(reductions, state, group);  // finishes the collective in flight, if any
  finish_in_flight(reductions);     // when begun before
  const Slot& slot = state.slots[index];
  std::erase(reductions.deferred, ModelGroup{state.layouts[slot.layout].client, slot.group});
  reductions.in_flight = start_group_reduction(active_chunk_manager(), group,
                                               state.layouts[slot.layout].groups[slot.group]);
}

// Note [Deferred to the outermost backward]: at the end of the outermost
// backward, the groups nested ones deferred and nothing reduced since.
void reduce_deferred(BackwardReductions& reductions, BackwardReduction& outermost,
                     c10d::ProcessGroup& group) {
  while (!reductions.deferred.empty()) {
    const ModelGroup key = reductions.deferred.front();
    const auto slot = std::ranges::find_if(outermost.slots, [&](const Slot& candidate) {
      return outermost.layouts[candidate.layout].client == key.client &&
             candidate.group == key.group;
    });
    if (slot == outermost.slots.end()) {  // its model went meanwhile
      reductions.deferred.erase(reductions.deferred.begin());
      continue;
    }
    reduce_slot(reductions, outermost, group,
                static_cast<std::size_t>(slot - outermost.slots.begin()));
  }
}

// Whether the first group this rank's backward writes is written: where
// the ranks agree on the order, at the time the first group would have
// gone had the order been this rank's alone.
bool first_expected_written(const BackwardReduction& state) {
  for (const Slot& slot : state.slots)
    if (slot.expected) return slot.unwritten == 0;
  return false;
}

// Reduces the slots of the order from `next` on that are ready, in order.
void reduce_ready(BackwardReductions& reductions, BackwardReduction& state,
                  c10d::ProcessGroup& group) {
  if (state.graph_known && !state.begun) {
    if (!first_expected_written(state)) return;
    begin(reductions, state, group);
  }
  while (state.next < state.order.size()) {
    const Slot& slot = state.slots[state.order[state.next]];
    if (!state.reached[slot.layout] || slot.unwritten > 0) return;
    reduce_slot(reductions, state, group, state.order[state.next++]);
  }
}

// The running backward of `graph_task`, or end().
auto find_running(BackwardReductions& reductions, int graph_task) {
  return std::find_if(reductions.running.begin(), reductions.running.end(),
                      [&](const auto& state) { return state->graph_task == graph_task; });
}

// The end of a backward: every group of its order not yet reduced. Those
// nested in it that never ended (failed) go with it.
void reduce_the_rest(int graph_task) {
  CollectivesTurn turn = take_collectives_turn();
  BackwardReductions& reductions = backward_reductions();
  const auto found = find_running(reductions, graph_task);
  if (found == reductions.running.end()) return;
  try {
    BackwardReduction& state = **found;
    if (turn.group) {
      if (state.graph_known) begin(reductions, state, *turn.group);
      for (; state.next < state.order.size(); ++state.next)
        if (state.reached[state.slots[state.order[state.next]].layout])
          reduce_slot(reductions, state, *turn.group, state.order[state.next]);
      if (found == reductions.running.begin()) reduce_deferred(reductions, state, *turn.group);
      finish_in_flight(reductions);
    }
  } catch (...) {
    reductions = BackwardReductions{};
    throw;
  }
  reductions.running.erase(found, reductions.running.end());
}

}  // namespace

void reduce_as_backward_completes(const ManagedParam& managed) {
  if (no_sync_depth.load(std::memory_order_acquire) > 0 || !data_parallel_group_set()) return;
  CollectivesTurn turn = take_collectives_turn();
  if (!turn.group) return;
  BackwardReductions& reductions = backward_reductions();
  const int graph_task = torch::autograd::get_current_graph_task_id();
  try {
    auto found = find_running(reductions, graph_task);
    if (found == reductions.running.end()) {
      std::erase_if(reductions.running,
                    [](const auto& state) { return state->task_alive.expired(); });
      const bool nested = !reductions.running.empty();
      if (!nested) reductions.deferred.clear();  // what a failed backward left
      reductions.running.push_back(start_backward(*turn.group, graph_task, nested));
      found = std::prev(reductions.running.end());
      auto task_alive = std::make_shared<const int>(0);
      (*found)->task_alive = task_alive;
      torch::autograd::Engine::get_default_engine().queue_callback(
          [graph_task, task_alive = std::move(task_alive)] { reduce_the_rest(graph_task); });
    }
    BackwardReduction& state = **found;
    const auto slot_of = state.slot_of.find(&managed);
    if (slot_of == state.slot_of.end()) return;  // managed since this backward began
    Slot& slot = state.slots[slot_of->second];
    state.slot_of.erase(slot_of);
    state.reached[slot.layout] = true;
    --slot.unwritten;
    reduce_ready(reductions, state, *turn.group);
  } catch (...) {
    reductions = BackwardReductions{};
    throw;
  }
}

}  // namespace spillway::torch_bridge

namespace spillway {

NoSync::NoSync() { torch_bridge::no_sync_depth.fetch_add(1, std::memory_order_acq_rel); }

NoSync::~NoSync() { torch_bridge::no_sync_depth.fetch_sub(1, std::memory_order_acq_rel); }

}  // namespace spillway
