// data_parallel.h: the bridge's side of data parallel training (Note [Data
// parallel over chunk groups] in data_parallel.cc). Private to hooks/torch.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hooks/torch/bridge.h"
#include "hooks/torch/collective_wait.h"
#include "hooks/torch/rank_layout.h"

namespace spillway::torch_bridge {

// With a process group set: checks that every rank laid out the client
// manage() just placed the same way, and gives every rank its owners' values
// (a collective). Nothing without a group.
void join_data_parallel(ChunkManager& chunks, ClientId client);

// How a chunk group's gradients reach their owner.
enum class GradientReduction {
  by_device,       // reduce-scatter where the collectives run on a GPU, else all-to-all
  all_to_all,      // Note [Gradients travel in their own dtype] (data_parallel.cc)
  reduce_scatter,  // Note [Reduce-scatter where the collectives run on a GPU]
};

// The reduction this process uses from now on: by_device unless a test
// forces one (the reduce-scatter path over Gloo, say). Every rank must
// choose alike.
void set_gradient_reduction(GradientReduction reduction);

// The backend of the data parallel group ("gloo", "nccl"), or "" with none.
std::string data_parallel_backend_name();

// With a process group set: every rank takes the values of the parameters
// other ranks own (after the owners' optimizer step). Nothing without one.
void gather_owned_parameters(ChunkManager& chunks);

// With a process group set, after reduce_gradients: `figures` holds one
// figure per parameter of a list every rank passes alike (a gradient's
// norm, say), present on the rank that holds the gradient; returns the
// list complete, the same on every rank (Note [Per-parameter figures summed
// over owners]). Throws std::runtime_error when a figure is present on two
// ranks (a gradient never reduced), naming `what` is taken. Without a
// group: `figures` unchanged.
std::vector<std::optional<double>> owned_figures_everywhere(
    std::vector<std::optional<double>> figures, std::string_view what);

// Whether `condition` holds on any rank (a gradient overflowed, say): the
// same answer on every rank. `condition` itself without a group.
bool on_any_rank(bool condition, std::string_view what);

// Waits until every rank of the group reaches it (a collective); a rank
// that died is named (Note [A failed collective names the missing ranks]).
// `what` says what waits ("saving a checkpoint"). Nothing without a group.
void barrier(std::string_view what);

// Called after a backward accumulated into `managed`'s gradient; with
// grad_mutex held. Throws std::runtime_error when it accumulated into the
// mean a reduction left there (Note [A backward onto a reduced gradient]).
void check_not_accumulating_onto_reduced(const ManagedParam& managed);

// Whether a data parallel group is set; without taking the lock, so it may
// be stale by the time the caller acts: a hint for skipping work.
bool data_parallel_group_set();

// The lock that serialises the data parallel collectives (one sequence of
// them per process), marking the thread that holds it.
class TurnLock {
 public:
  TurnLock();
  TurnLock(TurnLock&& other) noexcept;
  TurnLock& operator=(TurnLock&&) = delete;
  ~TurnLock();
  // Whether this thread holds the turn: an op it runs then belongs to a
  // collective, which must not start another.
  static bool held_by_this_thread();

 private:
  std::unique_lock<std::mutex> lock_;
};

// The data parallel group (null without one), with the turn.
struct CollectivesTurn {
  TurnLock lock;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};
CollectivesTurn take_collectives_turn();

// A chunk group's gathering under way: this rank's bytes of the
// parameters it owns sent, the others' in flight. Default-made: nothing to
// gather.
class GroupGather {
 public:
  GroupGather() = default;
  GroupGather(PendingCollective collective, at::Tensor all, std::int64_t widest,
              std::vector<std::vector<ManagedParam*>> members);
  // Waits for the bytes and writes in those of the parameters this rank
  // does not own (no op on them: their version counters stay).
  void finish(int rank);
  // Waits for the bytes and writes nothing: a gather no use needed.
  void abandon();

 private:
  std::optional<PendingCollective> collective_;
  at::Tensor all_;
  std::int64_t widest_ = 0;
  std::vector<std::vector<ManagedParam*>> members_;
};

// Starts one all-gather of the owners' bytes of `chunk_group`'s parameters
// that `moved` selects, reading this rank's from its chunks without an op.
// With the turn held.
GroupGather start_group_gather(c10d::ProcessGroup& group, const ChunkGroup& chunk_group,
                               bool (*moved)(const ManagedParam&));

// start_group_gather, then finish: every rank writes in the parameters it
// does not own. With the turn held.
void gather_chunk_group(c10d::ProcessGroup& group, const ChunkGroup& chunk_group,
                        bool (*moved)(const ManagedParam&));

// Broadcasts rank 0's bytes of every tensor of `layout` that no optimizer
// steps (Note [What no optimizer steps comes from rank 0]). With the turn
// held.
void broadcast_from_rank_zero(c10d::ProcessGroup& group, const RankLayout& layout);

// Counts a data parallel operation (Note [A failed collective names the
// missing ranks]); with the turn held.
void begin_operation(c10d::ProcessGroup& group);

// A chunk group's gradient reduction under way: this rank's gradients
// packed and sent (the collective in flight), the gradients of what other
// ranks own dropped. finish() waits for it and gives each owned parameter
// the mean where some rank wrote its gradient since the last reduction
// (Note [A reduction sends what backward wrote since the last]); it throws
// std::runtime_error when a backward wrote one of the owner's gradients
// meanwhile. Default-made: nothing to reduce.
class GroupReduction {
 public:
  GroupReduction() = default;
  GroupReduction(PendingCollective collective, std::function<void()> write_means);
  void finish();

 private:
  std::optional<PendingCollective> collective_;
  std::function<void()> write_means_;
};

// Starts reducing `chunk_group`'s gradients to their owners; with the turn
// held, and finished before another collective waits.
GroupReduction start_group_reduction(ChunkManager& chunks, c10d::ProcessGroup& group,
                                     const ChunkGroup& chunk_group);

// Clears the gradient_unreduced flags of the group's parameters (Note [A
// reduction reduces what backward wrote since the last]); a reduction does
// it as it packs the gradients.
void mark_gradients_reduced(const ChunkGroup& chunk_group);

// Called by the accumulation post hook (grad_binding.cc) once a backward
// has written `managed`'s gradient: reduces each chunk group whose
// gradients are all written, in the fixed order, and at the end of the
// backward every group left (Note [Reducing while backward runs],
// backward_reduction.cc). Nothing without a group or inside no_sync.
void reduce_as_backward_completes(const ManagedParam& managed);

// Note [What each rank is reducing for] (backward_reduction.cc): the
// all-gather that a backward's reduction and reduce_gradients() both begin
// with, after comparing layouts. `layouts` are every model's (rank_layouts
// without `only`); `per_layout` has one figure per layout, `per_slot` two
// per chunk group of them (or is empty). Returns every rank's figures
// (world size x the row, the kind column dropped). Throws
// std::runtime_error, on every rank alike, when some ranks reduce for a
// backward and others for an optimizer step without one, naming both and
// the models the backward reaches.
enum class ReducingFor : std::int64_t { backward = 1, optimizer_step = 2 };
at::Tensor all_gather_reducing_for(c10d::ProcessGroup& group, ReducingFor kind,
                                   const std::vector<RankLayout>& layouts,
                                   const std::vector<std::int64_t>& per_layout,
                                   const std::vector<std::int64_t>& per_slot);

// With dist:env and no group yet: joins the group torchrun's environment
// describes (Note [Joining the group torchrun describes], dist_env.cc).
// Throws std::runtime_error naming what is missing.
void join_group_from_environment_if_configured();

}  // namespace spillway::torch_bridge
