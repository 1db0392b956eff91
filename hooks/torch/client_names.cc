// Client names for the per-client part of memory_stats_json(). The chunk
// manager knows its clients' names but answers only by id; the bridge keeps
// its own list rather than widen the manager's interface for a report.
#include "hooks/torch/client_names.h"

#include <map>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

namespace spillway::torch_bridge {

namespace {

struct ClientNames {
  std::mutex mutex;
  std::map<ClientId, std::string> names;
};

ClientNames& client_names() {
  static ClientNames* const names = new ClientNames();  // never destroyed, as the runtime
  return *names;
}

}  // namespace

std::string unique_client_name(const std::string& kind) {
  static std::mutex mutex;
  static std::map<std::string, int> next;
  std::lock_guard lock(mutex);
  return kind + "#" + std::to_string(next[kind]++);
}

void name_client(ClientId client, std::string name) {
  ClientNames& registry = client_names();
  std::lock_guard lock(registry.mutex);
  registry.names[client] = std::move(name);
}

std::string client_name(ClientId client) {
  ClientNames& registry = client_names();
  std::lock_guard lock(registry.mutex);
  const auto found = registry.names.find(client);
  if (found != registry.names.end()) return found->second;
  return "client " + std::to_string(static_cast<std::uint32_t>(client));
}

std::string tensor_name(const ChunkManager& chunks, TensorId tensor) {
  const std::optional<TensorInfo> info = chunks.tensor_info(tensor);
  return info.has_value() ? info->name : std::string("?");
}

std::string add_client_stats(const std::string& stats_json, const ChunkManager& chunks) {
  std::map<ClientId, std::string> names;
  {
    ClientNames& registry = client_names();
    std::lock_guard lock(registry.mutex);
    names = registry.names;
  }
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(stats_json);
  nlohmann::ordered_json clients = nlohmann::ordered_json::object();
  for (const auto& [client, name] : names) {
    if (chunks.chunks_of(client).empty()) continue;  // removed, or nothing placed
    const ChunkStats stats = chunks.client_stats(client);
    clients[name] = {{"chunk_bytes.device", stats.chunk_bytes_device},
                     {"chunk_bytes.host", stats.chunk_bytes_host},
                     {"bytes_moved.h2d", stats.bytes_moved_h2d},
                     {"bytes_moved.d2h", stats.bytes_moved_d2h},
                     {"evictions", stats.evictions},
                     {"chunk_bytes.capacity", stats.capacity_bytes},
                     {"chunk_bytes.tensors", stats.tensor_bytes},
                     {"chunk_fill_ratio", stats.fill_ratio()}};
  }
  json["clients"] = std::move(clients);
  const PolicyState policy = chunks.policy_state();
  json["policy"] = {{"name", std::string(chunks.policy_name())},
                    {"phase", policy.phase},
                    {"steps", chunks.steps_ended()},
                    {"plans_built", policy.plans_built},
                    {"planned_steps", policy.planned_steps},
                    {"divergences", policy.divergences},
                    {"detected_period", policy.detected_period}};
  return json.dump();
}

}  // namespace spillway::torch_bridge
