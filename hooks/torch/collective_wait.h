// collective_wait.h: running a data parallel collective, and an error that
// names the ranks gone missing when it fails (Note [A failed collective
// names the missing ranks] in collective_wait.cc). Private to hooks/torch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace spillway::torch_bridge {

// Records in the group's store that this rank began its `sequence`-th data
// parallel operation (a reduction, a gathering, a join): what a failure
// compares. Every rank counts the same operations.
void note_progress(c10d::ProcessGroup& group, std::uint64_t sequence);

// The bytes one collective moves between this rank and the others, by what
// the collective means rather than how the backend does it: what a
// bandwidth-optimal algorithm sends and receives (Note [Counting what the
// collectives move] in collective_wait.cc).
struct CollectivePayload {
  std::int64_t sent = 0;
  std::int64_t received = 0;
};
// An all-gather of `bytes_per_rank` from each rank.
CollectivePayload all_gather_payload(std::int64_t bytes_per_rank, int world_size);
// A broadcast of `bytes` from one rank (`root`: this rank is the source).
CollectivePayload broadcast_payload(std::int64_t bytes, int world_size, bool root);
// An all-reduce of `bytes` (ring: a reduce-scatter, then an all-gather).
CollectivePayload all_reduce_payload(std::int64_t bytes, int world_size);

// The device that `group`'s collectives take their tensors on (Note [The
// device collectives take] in collective_wait.cc): the CPU where the group
// has a CPU backend, else its CUDA device. Throws std::invalid_argument,
// naming the backend, where neither is usable.
c10::Device collective_device(c10d::ProcessGroup& group);

// A collective issued and not yet waited for: its Work, and what the
// error says if it fails.
class PendingCollective {
 public:
  PendingCollective(c10::intrusive_ptr<c10d::ProcessGroup> group, std::string what,
                    c10::intrusive_ptr<c10d::Work> work);
  // Waits for it. When it failed, throws std::runtime_error saying `what`
  // failed, which ranks never reached this operation, and the backend's
  // own message.
  void wait();

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::string what_;
  c10::intrusive_ptr<c10d::Work> work_;
};

// Issues a collective with `issue` and counts `payload` into the process's
// traffic (spillway::data_parallel_traffic); throws as
// PendingCollective::wait does when issuing fails.
PendingCollective start_collective(c10d::ProcessGroup& group, std::string_view what,
                                   CollectivePayload payload,
                                   const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);

// start_collective, then wait.
void run_collective(c10d::ProcessGroup& group, std::string_view what, CollectivePayload payload,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue);

}  // namespace spillway::torch_bridge
