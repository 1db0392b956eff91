// spillway_torch.h: the LibTorch bridge's public API (design section 6).
//
// Design summary:
//  - manage() registers each parameter, and a gradient of the same shape, with
//    the process's chunk manager (one client per call), copies the
//    parameter's bytes into its chunk and rebinds the parameter's
//    c10::StorageImpl data pointer to chunk memory, so every view follows.
//    The bridge observes the chunk manager and rebinds again on every move;
//    under strict_residency an evicted tensor points at inaccessible memory.
//  - A global at::RecordFunction callback acquires the chunks of an op's
//    managed tensor inputs before the op and releases them after it
//    (op_hooks.cc), so any PyTorch code, torch::optim included, computes on
//    resident bytes.
//  - param.grad is a chunk-resident tensor, so autograd accumulates in place
//    (grad_binding.cc); a gradient autograd created afresh (after a
//    set-to-none zero_grad) is copied into the grad chunk at the next
//    opportunity.
//
// See docs/torch-bridge.md for what works and what does not yet.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace spillway {

// Sets the configuration (SPILLWAY_CONF syntax, design section 4) before
// anything is managed. Throws std::invalid_argument with the parser's message
// on a bad configuration, or when spillway is already active with another one.
void configure(const std::string& conf);

// Activates spillway now, from configure()'s text or else SPILLWAY_CONF, and
// installs the op hooks (manage() does this on first use). Throws
// std::runtime_error naming the cause when activation fails.
void activate();

// Makes spillway's caching allocator torch's CUDA allocator (through torch's
// CUDAPluggableAllocator), so that everything torch allocates on the GPU
// shares spillway's device budget with the chunks. Activates spillway; needs
// device:cuda (or device:auto with a usable GPU), and must run before torch
// allocates any CUDA memory. An allocation spillway cannot satisfy, even by
// spilling chunks, throws c10::OutOfMemoryError. Throws std::runtime_error
// naming the cause otherwise (no GPU, a build without torch's CUDA side).
void use_as_torch_cuda_allocator();

// Moves the parameters into chunks (one chunk-manager client per call) and
// binds their gradients to grad chunks (when a backward first defines them,
// as torch leaves a gradient undefined until then); a module's buffers go
// into chunks too. Parameters already managed are skipped. Throws std::runtime_error when spillway
// cannot activate or a parameter cannot be placed.
void manage(torch::nn::Module& module);
void manage(std::vector<torch::Tensor> params);
// As above, with the names the statistics, trace and errors show
// (module.named_parameters(), say; the Python package passes them), in a
// client named `client_name` with "#n" appended ("torch#0" by default; the
// Python package passes a module's class). Nothing new to manage adds no client.
void manage(std::vector<std::pair<std::string, torch::Tensor>> named_params,
            const std::string& client_name = "torch");

// Moves the parameters (and their bound gradients), and a module's buffers,
// back into ordinary storage and forgets them; a client whose tensors are all unmanaged is
// removed. Unknown tensors are ignored. No op may use them meanwhile.
void unmanage(torch::nn::Module& module);
void unmanage(std::vector<torch::Tensor> params);

// Whether the tensor's storage lives in a chunk (a managed parameter, its
// bound gradient, or a managed buffer).
bool is_managed(const torch::Tensor& tensor);

// Allocator and chunk figures under the contract keys (design section 3), as
// JSON; "{}" while spillway is not active.
std::string memory_stats_json();

// The iteration boundary, called after each optimizer step (the engine's
// step() calls it, and so does the end of every Python torch.optim
// optimizer's step, through a global step hook of the Python package): re-binds gradients that
// autograd created afresh (set-to-none zero_grad) into their grad chunks, counts the step and marks
// it in the trace. Does nothing while spillway is not active.
// Then check_budget_fits_ops().
void step();

// Throws std::runtime_error when an op needed more of chunks on the device at
// once than the budget holds (min_budget_bytes above the budget; the op ran
// past it, Note [Budget overruns]), naming the op and the budget to set; once
// for each new largest need. Python's optimizers call it after every step.
void check_budget_fits_ops();

// Writes a complete trace file (docs/trace-format.md) of the events the
// `trace` option recorded so far to `path`; the live trace file goes on.
// Throws std::runtime_error when tracing is off or a file cannot be read or
// written, std::invalid_argument when `path` is the live trace file itself.
void dump_trace(const std::string& path);

// --- Data parallel across ranks (docs/data-parallel.md) ------------------
// Trains every managed model data parallel over `group`, a torch c10d process
// group (Gloo on the CPU): each rank owns whole parameter chunks (rank r owns
// chunk r of each group of world-size chunks), gradients are reduced to their
// owners, the optimizer steps what this rank owns, and step() gives every
// rank the owners' new values. A collective, as is manage() while a group is
// set: every rank calls them in the same order with the same models. Compares
// the layouts of what is managed across ranks (throws std::runtime_error
// naming the first parameter that differs) and gives every rank the owners'
// values. A null group ends data parallel training.
void set_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group);
// Each owned parameter's gradient becomes the mean over the ranks (summed
// in rank order, in fp32); every other gradient is set to none, so any
// optimizer steps only what this rank owns. A parameter no rank reached
// keeps no gradient. backward does this itself, each chunk group as soon as
// its gradients are written (Note [Reducing while backward runs]), so this
// reduces only what a backward left (one inside NoSync, say); the
// optimizer's step calls it. A second call with no backward in between
// reduces nothing (Note [A reduction reduces what backward wrote since the
// last]); a backward onto reduced gradients, before they are zeroed, throws
// from backward (Note [A backward onto a reduced gradient]). Nothing
// without a group.
void reduce_gradients();
// As above, for the models that hold one of `params` only (an optimizer's:
// Python's optimizers call it before each step, so that two models with two
// optimizers are each reduced once, before their own step).
void reduce_gradients(const std::vector<torch::Tensor>& params);
// While one is alive (in any thread), backward does not reduce gradients
// across ranks: torch DDP's no_sync. Wrap every micro-batch of an
// accumulation window but the last; the last one's backward reduces what
// they all accumulated. Without it a second micro-batch's backward would
// add to reduced means, which throws.
class NoSync {
 public:
  NoSync();
  ~NoSync();
  NoSync(const NoSync&) = delete;
  NoSync& operator=(const NoSync&) = delete;
};
// torch::nn::utils::clip_grad_norm_ for data parallel training: reduces the
// gradients of the models that hold `params` (reduce_gradients(params), so
// the optimizer's step does not reduce again), then clips by the norm of the
// mean gradient, the same on every rank and bit for bit the norm torch's
// function returns in one process holding the mean gradients (Note [Clipping
// the mean gradient across ranks]). A collective: every rank passes the same
// parameters. Without a group, torch's function itself.
double clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);
// This process's rank and the group's size; 0 and 1 without a group.
int data_parallel_rank();
int data_parallel_world_size();
// The rank that owns each of `tensors` (a managed parameter or buffer) under
// the current layout: the rank whose optimizer steps it, and which writes
// it to a checkpoint by owner. 0 for every managed tensor without a group;
// -1 for a tensor spillway does not manage (every rank holds its own).
std::vector<int> data_parallel_owners(const std::vector<torch::Tensor>& tensors);
// What this process's data parallel collectives moved to and from the other
// ranks since it started: payload bytes by each collective's meaning (an
// all-gather of b bytes per rank sends b to each other rank), not the
// backend's own traffic (Note [Counting what the collectives move]).
struct DataParallelTraffic {
  std::int64_t bytes_sent = 0;
  std::int64_t bytes_received = 0;
  std::int64_t collectives = 0;
  // Chunk groups gathered for the ops that use them (dist_params:sharded:
  // Note [Parameters gathered for their use]); each is one all-gather.
  std::int64_t parameter_gathers = 0;
  // Of those, the ones issued ahead of their use by the plan of a recorded
  // step (Note [A plan of gathers from the recorded step]).
  std::int64_t parameter_gathers_ahead = 0;
};
DataParallelTraffic data_parallel_traffic();
// The capacity of the managed models' parameter chunks, and of those that
// hold bytes on this rank (on the device or the host): all of them, but
// with dist_params:sharded about 1/N between steps (Note [Parameters
// gathered for their use] in hooks/torch/sharded_params.cc).
struct ParameterChunkBytes {
  std::size_t held = 0;
  std::size_t total = 0;
};
ParameterChunkBytes parameter_chunk_bytes();

// Checkpoints by owner (docs/data-parallel.md; Note [Checkpoints by owner
// from C++] in owner_checkpoint.cc): the files the Python package's
// spillway.save_checkpoint writes, so either side loads the other's and
// `python -m spillway.consolidate` makes one torch state_dict of them.
// A checkpoint that cannot be written, or does not fit what loads it.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Writes `module`'s parameters and buffers and `optimizer`'s state into
// `directory`, each rank what it owns. A collective under data parallel
// training: every rank calls it with the same module and optimizer, after the
// step. Without a group it writes one shard. The optimizer, if any, is Adam,
// AdamW or SGD, torch::optim's or spillway::optim's (the state is written in
// torch.optim's layout); another throws CheckpointError, as does a file that
// cannot be written.
void save_checkpoint(const std::string& directory, torch::nn::Module& module,
                     torch::optim::Optimizer* optimizer = nullptr);
// Reads a checkpoint saved at any world size into `module` (every tensor)
// and `optimizer` (its param groups' options, and the state of what this rank
// owns under the current layout). Under data parallel training, call it on
// every rank after manage(). Throws CheckpointError naming what does not fit
// or cannot be read.
void load_checkpoint(const std::string& directory, torch::nn::Module& module,
                     torch::optim::Optimizer* optimizer = nullptr);

}  // namespace spillway

#include "hooks/torch/engine.h"  // spillway::initialize
#include "hooks/torch/optim.h"   // spillway::optim::Adam, AdamW, SGD
