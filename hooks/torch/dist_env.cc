// dist:env: the data-parallel group torchrun's environment describes.
//
// Note [Joining the group torchrun describes]
// torchrun starts each rank with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set. Under its own rendezvous (TORCHELASTIC_USE_AGENT_STORE
// true) a store is already served at MASTER_ADDR:MASTER_PORT, and each
// worker connects as a client under "/worker/attempt_<restart count>", as
// torch.distributed does; otherwise rank 0 serves the store itself. The
// group lives under a prefix of spillway's own in that store, so it does not
// meet a group the program makes itself. Joined at the first manage(),
// which is then a collective like every manage() with a group.
// Its backend follows the memory spillway manages: NCCL's, bound to the
// runtime's GPU, where that is a CUDA device (the collectives then take
// the gradients on the GPU and reduce-scatter them: Note [Reduce-scatter
// where the collectives run on a GPU] in data_parallel.cc); Gloo's on the
// simulated device. A GPU run in a build without NCCL's header fails with
// an error that says so, rather than crossing the PCIe link through Gloo.
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "allocator/runtime.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/spillway_torch.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if SPILLWAY_HAVE_GLOO_HEADERS
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
// torch's CUDA side defines USE_C10D_NCCL; its header needs NCCL's own.
#if SPILLWAY_HAVE_TORCH_CUDA && defined(USE_C10D_NCCL) && __has_include(<nccl.h>)
#define SPILLWAY_HAVE_NCCL_GROUP 1
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#define SPILLWAY_HAVE_NCCL_GROUP 0
#endif

namespace spillway::torch_bridge {

namespace {

std::string required_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0')
    throw std::runtime_error(fmt::format(
        "spillway: dist:env needs the environment variable {}, which torchrun sets; it is not "
        "set (start the program with torchrun, or pass a group with set_process_group)",
        name));
  return value;
}

int integer_variable(const char* name) {
  const std::string text = required_variable(name);
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(
      fmt::format("spillway: dist:env: {}={} is not a non-negative integer", name, text));
}

c10::intrusive_ptr<c10d::Store> store_from_environment(int rank, int world) {
  const std::string host = required_variable("MASTER_ADDR");
  const int port = integer_variable("MASTER_PORT");
  if (port > 65535)
    throw std::runtime_error(
        fmt::format("spillway: dist:env: MASTER_PORT={} is not a TCP port (0 to 65535)", port));
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_store = agent != nullptr && std::string(agent) == "True";
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = !agent_store && rank == 0;
  options.numWorkers = static_cast<std::size_t>(world);
  options.waitWorkers = false;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(host, options);
  if (agent_store) {
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    store = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", restarts != nullptr ? restarts : "0"), store);
  }
  return c10::make_intrusive<c10d::PrefixStore>("spillway", store);
}

c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int world) {
#if SPILLWAY_HAVE_GLOO_HEADERS
  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  (void)store, (void)rank, (void)world;
  throw std::runtime_error(
      "spillway: dist:env on the simulated device needs Gloo's headers at build time (Debian's "
      "libgloo-dev), and this build had none; pass a group with set_process_group instead");
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int world, int ordinal) {
#if SPILLWAY_HAVE_NCCL_GROUP
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  // Before setBackend, which hands the binding to the backend.
  group->setBoundDeviceId(
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ordinal)));
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return group;
#else
  (void)store, (void)rank, (void)world, (void)ordinal;
  throw std::runtime_error(
      "spillway: dist:env on a CUDA device makes an NCCL group, and this build has none (it "
      "needs torch's CUDA side and NCCL's nccl.h at build time); pass a group with "
      "set_process_group instead");
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> group_from_environment() {
  const int rank = integer_variable("RANK");
  const int world = integer_variable("WORLD_SIZE");
  if (world < 1 || rank >= world)
    throw std::runtime_error(
        fmt::format("spillway: dist:env: RANK={} WORLD_SIZE={} do not describe a rank of a group",
                    rank, world));
  const Runtime& runtime = Runtime::process();
  const bool on_a_gpu = runtime.device().kind() == DeviceKind::cuda;
#if !SPILLWAY_HAVE_NCCL_GROUP
  if (on_a_gpu) return nccl_group(nullptr, rank, world, 0);  // the error, before any store
#endif
  const c10::intrusive_ptr<c10d::Store> store = store_from_environment(rank, world);
  if (on_a_gpu) return nccl_group(store, rank, world, runtime.device_ordinal());
  return gloo_group(store, rank, world);
}

}  // namespace

void join_group_from_environment_if_configured() {
  Runtime& runtime = Runtime::process();
  if (runtime.config().dist != DistMode::env || data_parallel_world_size() > 1) return;
  static std::once_flag joined;
  std::call_once(joined, [] { set_process_group(group_from_environment()); });
}

}  // namespace spillway::torch_bridge
