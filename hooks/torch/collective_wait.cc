// Running a data parallel collective.
//
// Note [A failed collective names the missing ranks]
// When a rank dies or hangs, the others' collectives fail (Gloo: a peer's
// connection closed) or time out, and the backend's message names an
// address or a barrier, not the rank at fault. So each rank writes, in the
// group's store, the number of the data parallel operation it begins
// (note_progress: one store write per reduction or gathering, not per
// collective). A rank whose collective failed reads everyone's: the ranks
// behind it never reached this operation, and the error names them. A rank
// that dies inside the operation itself is not behind, and the error says
// that none is known. A rank blocked behind another's failure (a barrier
// that waits on rank 0, say) is not behind either, so it is not blamed.
//
// Note [Counting what the collectives move]
// data_parallel_traffic() is what the dp_comm_bytes_vs_min benchmark
// divides by the minimum a step must move, so it counts what each
// collective must move to or from the other ranks by its meaning, not what
// Gloo's algorithm happens to send: an all-gather of b bytes per rank sends
// b to each of the N-1 others and receives as much; an all-reduce of b
// bytes moves 2(N-1)/N b each way, as a ring does; an all-to-all sends every
// segment but this rank's own. Padding and flags sent beside the values
// count, since they cross. The store's traffic (note_progress) does not: it
// is a few bytes per operation and goes to the store, not the ranks.
#include "hooks/torch/collective_wait.h"

#include <algorithm>
#include <atomic>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "hooks/torch/sharded_params.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

std::string progress_key(int rank) {
  return "spillway/data_parallel/progress/" + std::to_string(rank);
}

std::uint64_t progress_of(c10d::Store& store, int rank) {
  const std::string key = progress_key(rank);
  if (!store.check({key})) return 0;
  const std::vector<std::uint8_t> value = store.get(key);
  return std::stoull(std::string(value.begin(), value.end()));
}

// The ranks behind this one; empty when the store cannot tell.
std::vector<int> ranks_behind(c10d::ProcessGroup& group) {
  const c10::intrusive_ptr<c10d::Store> store = group.getStore();
  if (!store) return {};
  std::vector<int> behind;
  try {
    const std::uint64_t mine = progress_of(*store, group.getRank());
    for (int rank = 0; rank < group.getSize(); ++rank)
      if (progress_of(*store, rank) < mine) behind.push_back(rank);
  } catch (const std::exception&) {
    return {};  // the store went with the failure (rank 0's TCPStore, say)
  }
  return behind;
}

std::atomic<std::int64_t> bytes_sent{0};
std::atomic<std::int64_t> bytes_received{0};
std::atomic<std::int64_t> collectives{0};

}  // namespace

CollectivePayload all_gather_payload(std::int64_t bytes_per_rank, int world_size) {
  const std::int64_t others = world_size - 1;
  return {bytes_per_rank * others, bytes_per_rank * others};
}

CollectivePayload broadcast_payload(std::int64_t bytes, int world_size, bool root) {
  if (root) return {bytes * (world_size - 1), 0};
  return {0, bytes};
}

CollectivePayload all_reduce_payload(std::int64_t bytes, int world_size) {
  const std::int64_t each_way = 2 * (world_size - 1) * bytes / world_size;
  return {each_way, each_way};
}

void note_progress(c10d::ProcessGroup& group, std::uint64_t sequence) {
  const c10::intrusive_ptr<c10d::Store> store = group.getStore();
  if (!store) return;
  const std::string value = std::to_string(sequence);
  store->set(progress_key(group.getRank()), std::vector<std::uint8_t>(value.begin(), value.end()));
}

// Note [The device collectives take]
// A backend takes tensors of the device types it was registered for: Gloo
// the CPU's (and CUDA's), NCCL CUDA's only. torch.distributed's default
// group on a GPU machine has both ("cpu:gloo,cuda:nccl"), but a group made
// with backend="nccl" has no CPU backend, and a CPU tensor fails in it. So
// the staging tensors of every collective are made on collective_device():
// the CPU where the group has a CPU backend (the bytes then cross no
// PCIe link), else the group's CUDA device. What the host reads back
// (flags, norms, layout fingerprints) is copied to the CPU after the
// collective. Gradients and parameters are copied into and out of the
// staging tensors with copy_, which crosses devices as needed.
c10::Device collective_device(c10d::ProcessGroup& group) {
  const std::vector<c10::Device> devices = group.getDeviceTypes();
  const auto has = [&](c10::DeviceType type) {
    return std::ranges::any_of(devices, [&](const c10::Device& d) { return d.type() == type; });
  };
  // No registered backend at all: a ProcessGroup subclass of its own,
  // which takes CPU tensors as ProcessGroups did before backends.
  if (devices.empty() || has(c10::DeviceType::CPU)) return c10::Device(c10::DeviceType::CPU);
  if (has(c10::DeviceType::CUDA) && at::hasCUDA()) {
    if (const std::optional<at::Device> bound = group.getBoundDeviceId()) return *bound;
    return c10::Device(c10::DeviceType::CUDA, at::detail::getCUDAHooks().getCurrentDevice());
  }
  std::vector<std::string> names;
  for (const c10::Device& device : devices)
    names.push_back(c10::DeviceTypeName(device.type(), /*lower_case=*/true));
  throw std::invalid_argument(fmt::format(
      "spillway data parallel: the process group's backend ({}) takes tensors of {} only, and "
      "{} usable in this process. Use a group with a CPU backend (\"gloo\", or "
      "\"cpu:gloo,cuda:nccl\", torch.distributed's default on a GPU machine), or run where its "
      "device is usable",
      group.getBackendName(), fmt::join(names, ", "),
      has(c10::DeviceType::CUDA) ? "CUDA is not" : "none of them is"));
}

namespace {

// The error of a collective that failed, with the ranks behind this one.
std::runtime_error collective_failed(c10d::ProcessGroup& group, std::string_view what,
                                     const std::exception& cause) {
  const std::vector<int> behind = ranks_behind(group);
  const std::string who = behind.empty()
                              ? std::string("no rank is known to have stopped before it")
                              : fmt::format("rank{} {} never reached it (died or hung before)",
                                            behind.size() > 1 ? "s" : "", fmt::join(behind, ", "));
  return std::runtime_error(
      fmt::format("spillway data parallel: {} failed on rank {} of {}: {}. The backend said: {}",
                  what, group.getRank(), group.getSize(), who, cause.what()));
}

}  // namespace

PendingCollective::PendingCollective(c10::intrusive_ptr<c10d::ProcessGroup> group, std::string what,
                                     c10::intrusive_ptr<c10d::Work> work)
    : group_(std::move(group)), what_(std::move(what)), work_(std::move(work)) {}

void PendingCollective::wait() {
  try {
    work_->wait();
  } catch (const std::exception& e) {
    throw collective_failed(*group_, what_, e);
  }
}

PendingCollective start_collective(c10d::ProcessGroup& group, std::string_view what,
                                   CollectivePayload payload,
                                   const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  bytes_sent.fetch_add(payload.sent, std::memory_order_relaxed);
  bytes_received.fetch_add(payload.received, std::memory_order_relaxed);
  collectives.fetch_add(1, std::memory_order_relaxed);
  try {
    return PendingCollective(c10::intrusive_ptr<c10d::ProcessGroup>::reclaim_copy(&group),
                             std::string(what), issue());
  } catch (const std::exception& e) {
    throw collective_failed(group, what, e);
  }
}

void run_collective(c10d::ProcessGroup& group, std::string_view what, CollectivePayload payload,
                    const std::function<c10::intrusive_ptr<c10d::Work>()>& issue) {
  start_collective(group, what, payload, issue).wait();
}

}  // namespace spillway::torch_bridge

namespace spillway {

DataParallelTraffic data_parallel_traffic() {
  using torch_bridge::bytes_received;
  using torch_bridge::bytes_sent;
  using torch_bridge::collectives;
  return {bytes_sent.load(std::memory_order_relaxed),
          bytes_received.load(std::memory_order_relaxed),
          collectives.load(std::memory_order_relaxed), torch_bridge::parameter_gathers(),
          torch_bridge::parameter_gathers_ahead()};
}

}  // namespace spillway
