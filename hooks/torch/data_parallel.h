// data_parallel.h: the bridge's side of data parallel training (Note [Data
// parallel over chunk groups] in data_parallel.cc). Private to hooks/torch.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hooks/torch/bridge.h"

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

// With dist:env and no group yet: joins the group torchrun's environment
// describes (Note [Joining the group torchrun describes], dist_env.cc).
// Throws std::runtime_error naming what is missing.
void join_group_from_environment_if_configured();

}  // namespace spillway::torch_bridge
