// dist:env: the data-parallel group torchrun's environment describes.
//
// Note [Joining the group torchrun describes]
// torchrun starts each rank with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set. Under its own rendezvous (TORCHELASTIC_USE_AGENT_STORE
// true) a store is already served at MASTER_ADDR:MASTER_PORT, and each
// worker connects as a client under "/worker/attempt_<restart count>", as
// torch.distributed does; otherwise rank 0 serves the store itself. The
// group is Gloo's over that store, under a prefix of spillway's own, so it
// does not meet a group the program makes itself. Joined at the first
// manage(), which is then a collective like every manage() with a group.
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "allocator/runtime.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/spillway_torch.h"

#if SPILLWAY_HAVE_GLOO_HEADERS
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
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

#if SPILLWAY_HAVE_GLOO_HEADERS
c10::intrusive_ptr<c10d::ProcessGroup> group_from_environment() {
  const int rank = integer_variable("RANK");
  const int world = integer_variable("WORLD_SIZE");
  const std::string host = required_variable("MASTER_ADDR");
  const int port = integer_variable("MASTER_PORT");
  if (world < 1 || rank >= world || port > 65535)
    throw std::runtime_error(fmt::format(
        "spillway: dist:env: RANK={} WORLD_SIZE={} MASTER_PORT={} do not describe a rank of a "
        "group",
        rank, world, port));
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
  store = c10::make_intrusive<c10d::PrefixStore>("spillway", store);
  auto gloo_options = c10d::ProcessGroupGloo::Options::create();
  gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, gloo_options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}
#else
c10::intrusive_ptr<c10d::ProcessGroup> group_from_environment() {
  throw std::runtime_error(
      "spillway: dist:env needs Gloo's headers at build time (Debian's libgloo-dev), and this "
      "build had none; pass a group with set_process_group instead");
}
#endif

}  // namespace

void join_group_from_environment_if_configured() {
  Runtime& runtime = Runtime::process();
  if (runtime.config().dist != DistMode::env || data_parallel_world_size() > 1) return;
  static std::once_flag joined;
  std::call_once(joined, [] { set_process_group(group_from_environment()); });
}

}  // namespace spillway::torch_bridge
