// sharded_params.h: with dist_params:sharded, each rank keeps the
// parameters it owns and gathers the others' for their use (Note
// [Parameters gathered for their use] in sharded_params.cc). Private to
// hooks/torch.
#pragma once

#include <optional>
#include <span>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "hooks/torch/bridge.h"

namespace spillway::torch_bridge {

// Chunk groups one model keeps gathered at once (Note [Parameters gathered
// for their use]). A layer's tensors can straddle two chunks, and the
// layout puts chunks of one size together (Note [Chunk groups of one
// size]), so a transformer block's weights sit in groups apart from its
// biases and norms: with two, bench_dp's GPT at N = 4 moved 2.35 times
// ZeRO-3's least traffic a step; with four, 1.0 (0.999), and 1.075 at N = 2.
inline constexpr std::size_t kGatheredGroupsPerModel = 4;

// Gathers a step that follows a plan issues ahead of their use, beyond the
// window (Note [Gathers issued ahead of their use]): their bytes wait in
// staging buffers, not in chunks, until the use.
inline constexpr std::size_t kGathersAhead = 2;

// Whether this process shards parameters over `group`: dist_params:sharded
// and more than one rank.
bool parameters_sharded(c10d::ProcessGroup& group);

// The op hook's, before it acquires an op's inputs: `params` are the
// managed parameters the op uses. Gathers the chunk groups of those this
// rank dropped (a collective per group), then drops the groups used
// longest ago beyond the window. Throws std::runtime_error when a gather
// fails or the ranks gather different groups.
void gather_for_op(std::span<ManagedParam* const> params);

// With the turn held, at a step boundary before anything else is gathered
// (a collective): waits for the gathers issued ahead and never used,
// compares the ranks' uses since the last boundary, and makes the plan of
// the steps that start as this one did (Note [Gathers issued ahead of
// their use]). Throws std::runtime_error, naming the rank, when a rank's
// uses differ from rank 0's.
void end_interval(c10d::ProcessGroup& group);

// With the turn held, before the step's broadcast of what no optimizer
// steps (Note [What no optimizer steps comes from rank 0]): gathers each
// dropped group holding a parameter frozen since, whose bytes are then on
// its owner alone.
void gather_frozen_since_dropped(c10d::ProcessGroup& group);

// With the turn held, once the owners' values are final (manage(),
// step()): drops the bytes of every parameter this rank neither owns nor
// needs from rank 0, for every model or for `only`. Throws
// std::runtime_error when one is in use.
void drop_gathered(ChunkManager& chunks, c10d::ProcessGroup& group, std::optional<ClientId> only);

// Note [Uses only the owner makes] (sharded_params.cc): while an
// OwnerUses lives, or from reduce_gradients() (open_owner_step) to
// spillway::step() (close_owner_step), ops use the parameters this rank
// owns in place and refuse those it dropped, gathering nothing.
class OwnerUses {
 public:
  OwnerUses();
  ~OwnerUses();
  OwnerUses(const OwnerUses&) = delete;
  OwnerUses& operator=(const OwnerUses&) = delete;
};
void open_owner_step();
void close_owner_step();

// Groups gathered so far by gather_for_op and gather_everything_dropped.
std::int64_t parameter_gathers();
// Of those, the ones issued ahead of their use.
std::int64_t parameter_gathers_ahead();

// Gathers every group this rank dropped, through the group it was dropped
// in (a collective), and keeps them: before that group is replaced.
void gather_everything_dropped();

}  // namespace spillway::torch_bridge
