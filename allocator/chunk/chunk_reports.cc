// ChunkManager, part three: what it tells others. Observers learn tensors'
// addresses at each move, the trace gets chunk events, callers get stats,
// the smallest budget, introspection and messages that name tensors and chunks. (The access
// protocol, residency and pressure: chunk_manager.cc; clients and layout:
// chunk_layout.cc.)
//
// Note [Strict residency]
// With strict_residency each chunk reserves an inaccessible range of its
// capacity, and a tensor not on the device has its address there, so a
// kernel or host read that missed its acquire faults instead of reading
// stale bytes. Observers are told these addresses like any other.
//
// Note [Errors say who holds what]
// A fetch that cannot make room fails with the chunk, the budget and the
// chunks in compute with the tensors acquired in them, because "out of
// memory" alone does not tell a user which acquire was never released.
#include <algorithm>

#include <fmt/format.h>

#include "allocator/chunk/chunk.h"
#include "allocator/chunk/chunk_manager.h"
#include "allocator/config/format_bytes.h"

namespace spillway {
namespace {

// How many chunks in compute an error lists before "and N more".
constexpr std::size_t kChunksListed = 8;

}  // namespace

// --- Observers -----------------------------------------------------------

void ChunkManager::add_observer(ChunkObserver* observer) {
  std::lock_guard lock(mutex_);
  observers_.push_back(observer);
}

void ChunkManager::remove_observer(ChunkObserver* observer) {
  std::lock_guard lock(mutex_);
  std::erase(observers_, observer);
}

void ChunkManager::notify_locked(const Chunk& chunk) {
  if (observers_.empty()) return;
  moved_scratch_.clear();
  for (TensorId id : chunk.tensors) {
    const TensorRecord& tensor = *find_tensor_locked(id);
    moved_scratch_.push_back(
        {id, tensor.client, tensor_address_locked(chunk, tensor), chunk.location()});
  }
  for (ChunkObserver* observer : observers_) observer->on_tensors_moved(moved_scratch_);
}

void* ChunkManager::tensor_address_locked(const Chunk& chunk, const TensorRecord& tensor) const {
  if (chunk.resident()) return static_cast<char*>(chunk.device_data) + tensor.offset;
  if (options_.strict_residency && chunk.inaccessible.data() != nullptr) {
    return static_cast<char*>(chunk.inaccessible.data()) +
           tensor.offset;  // Note [Strict residency]
  }
  if (chunk.host_current) return static_cast<char*>(chunk.host.data) + tensor.offset;
  return nullptr;
}

// --- Trace and stats -----------------------------------------------------

// Recorded under the lock, as the allocator does, so the trace's order is the
// order of effects (Note [Trace order] in trace_recorder.h): a chunk's fetch
// follows the alloc of its device copy.
void ChunkManager::trace_chunk_locked(TraceEventKind kind, const Chunk& chunk, std::uint64_t size,
                                      std::uint16_t detail) {
  if (trace_ == nullptr) return;
  TraceEvent event;
  event.time_ns = device_.now_ns();
  event.kind = kind;
  event.stream = device_copy_bytes(chunk);  // Note [A device copy is a whole slab]
  event.address = static_cast<std::uint64_t>(chunk.id);
  event.size = size;
  event.detail = detail;
  event.client = static_cast<std::uint32_t>(chunk.client);
  trace_->record(event);
}

void ChunkManager::trace_mark_locked(TraceEventKind kind, std::uint64_t address,
                                     std::uint64_t size) {
  if (trace_ == nullptr) return;
  TraceEvent event;
  event.time_ns = device_.now_ns();
  event.kind = kind;
  event.address = address;
  event.size = size;
  trace_->record(event);
}

PolicyState ChunkManager::policy_state() const {
  std::lock_guard lock(mutex_);
  return policy_->state();
}

std::string_view ChunkManager::policy_name() const {
  std::lock_guard lock(mutex_);
  return policy_->name();
}

std::uint64_t ChunkManager::steps_ended() const {
  std::lock_guard lock(mutex_);
  return steps_ended_;
}

// The layout figures of ChunkStats, from the chunks as they are now.
void ChunkManager::add_layout_locked(std::span<const ChunkId> chunks, ChunkStats* stats) const {
  for (ChunkId id : chunks) {
    const Chunk& chunk = *find_chunk_locked(id);
    stats->capacity_bytes += static_cast<std::int64_t>(chunk.capacity);
    for (TensorId tensor : chunk.tensors)
      stats->tensor_bytes += static_cast<std::int64_t>(find_tensor_locked(tensor)->bytes);
  }
}

ChunkStats ChunkManager::stats() const {
  std::lock_guard lock(mutex_);
  ChunkStats stats = stats_;
  for (const auto& [id, client] : clients_) add_layout_locked(client.chunks, &stats);
  return stats;
}

ChunkStats ChunkManager::client_stats(ClientId id) const {
  std::lock_guard lock(mutex_);
  auto client = clients_.find(id);
  if (client == clients_.end()) return ChunkStats{};
  ChunkStats stats = client->second.stats;
  add_layout_locked(client->second.chunks, &stats);
  return stats;
}

// --- The smallest budget -------------------------------------------------

// Note [The smallest budget]
// min_budget_bytes is the largest capacity of chunks that one user (an op,
// with the ops around it on its thread) needed on the device at once, as the
// op hooks report it. A chunk budget below it cannot run the model without a
// budget overrun (Note [Budget overruns] in chunk_manager.cc), so the bridge
// turns it into an error at the step boundary. It counts each distinct chunk
// once: tensors that share a chunk need it once.
std::size_t ChunkManager::note_working_set(std::span<const TensorId> tensors,
                                           std::string_view user) {
  std::lock_guard lock(mutex_);
  std::vector<ChunkId> seen;
  std::size_t bytes = 0;
  for (const TensorId id : tensors) {
    const TensorRecord* tensor = find_tensor_locked(id);
    if (tensor == nullptr || std::find(seen.begin(), seen.end(), tensor->chunk) != seen.end())
      continue;
    seen.push_back(tensor->chunk);
    bytes += device_copy_bytes(*find_chunk_locked(tensor->chunk));
  }
  if (bytes > min_budget_bytes_) {
    min_budget_bytes_ = bytes;
    min_budget_user_ = std::string(user);
    trace_mark_locked(TraceEventKind::min_budget, 0, bytes);
  }
  return bytes;
}

std::size_t ChunkManager::min_budget_bytes() const {
  std::lock_guard lock(mutex_);
  return min_budget_bytes_;
}

std::string ChunkManager::min_budget_user() const {
  std::lock_guard lock(mutex_);
  return min_budget_user_;
}

std::size_t ChunkManager::effective_budget_bytes() const {
  std::lock_guard lock(mutex_);
  return effective_budget_locked();
}

// --- Introspection -------------------------------------------------------

std::optional<TensorInfo> ChunkManager::tensor_info(TensorId id) const {
  std::lock_guard lock(mutex_);
  const TensorRecord* tensor = find_tensor_locked(id);
  if (tensor == nullptr) return std::nullopt;
  const Chunk& chunk = *find_chunk_locked(tensor->chunk);
  TensorInfo info;
  info.client = tensor->client;
  info.chunk = tensor->chunk;
  info.offset = tensor->offset;
  info.bytes = tensor->bytes;
  info.kind = tensor->spec.kind;
  info.slot = tensor->spec.slot;
  info.state = tensor->state;
  info.location = chunk.location();
  info.address = tensor_address_locked(chunk, *tensor);
  info.name = tensor->spec.name;
  return info;
}

std::optional<ChunkInfo> ChunkManager::chunk_info(ChunkId id) const {
  std::lock_guard lock(mutex_);
  const Chunk* chunk = find_chunk_locked(id);
  if (chunk == nullptr) return std::nullopt;
  ChunkInfo info;
  info.client = chunk->client;
  info.kind = chunk->kind;
  info.slot = chunk->slot;
  info.capacity_bytes = chunk->capacity;
  info.used_bytes = chunk->used_bytes;
  info.tensor_count = chunk->tensors.size();
  info.location = chunk->location();
  info.state = chunk->state();
  info.dirty = chunk->dirty();
  info.pinned_host = chunk->host.pinned;
  return info;
}

std::vector<ChunkId> ChunkManager::chunks_of(ClientId id) const {
  std::lock_guard lock(mutex_);
  auto client = clients_.find(id);
  return client == clients_.end() ? std::vector<ChunkId>{} : client->second.chunks;
}

std::vector<TensorId> ChunkManager::tensors_of(ClientId id) const {
  std::lock_guard lock(mutex_);
  auto client = clients_.find(id);
  return client == clients_.end() ? std::vector<TensorId>{} : client->second.tensors;
}

// --- Messages ------------------------------------------------------------

std::string ChunkManager::tensor_label_locked(const TensorRecord& tensor) const {
  auto client = clients_.find(tensor.client);
  return fmt::format("tensor '{}' of client '{}'", tensor.spec.name,
                     client == clients_.end() ? std::string("?") : client->second.name);
}

std::string ChunkManager::chunk_label_locked(const Chunk& chunk) const {
  auto client = clients_.find(chunk.client);
  std::string kind(to_string(chunk.kind));
  if (chunk.kind == TensorKind::optimizer_state) kind += fmt::format(" slot {}", chunk.slot);
  return fmt::format("chunk {} ({} of client '{}', {})", static_cast<unsigned>(chunk.id), kind,
                     client == clients_.end() ? std::string("?") : client->second.name,
                     format_bytes(chunk.capacity));
}

// Note [Errors say who holds what]
std::string ChunkManager::describe_in_use_locked() const {
  std::vector<const Chunk*> in_use;
  for (const auto& chunk : chunks_) {
    if (chunk && chunk->in_use()) in_use.push_back(chunk.get());
  }
  if (in_use.empty()) return "No chunk is in compute.";
  std::string text =
      fmt::format("{} chunk{} in compute:", in_use.size(), in_use.size() == 1 ? " is" : "s are");
  for (std::size_t i = 0; i < in_use.size() && i < kChunksListed; ++i) {
    const Chunk& chunk = *in_use[i];
    text += fmt::format(" {}{} on the {}, acquired:", i == 0 ? "" : "; ", chunk_label_locked(chunk),
                        chunk.resident() ? "device" : "host");
    for (TensorId id : chunk.tensors) {
      const TensorRecord& tensor = *find_tensor_locked(id);
      const std::uint32_t users = tensor.device_users + tensor.host_users;
      if (users != 0) text += fmt::format(" '{}' x{}", tensor.spec.name, users);
    }
  }
  if (in_use.size() > kChunksListed) {
    text += fmt::format("; and {} more", in_use.size() - kChunksListed);
  }
  return text + ".";
}

std::string ChunkManager::describe_holdings_locked() const {
  std::size_t chunk_count = 0;
  std::size_t resident = 0;
  std::size_t in_compute = 0;
  for (const auto& chunk : chunks_) {
    if (!chunk) continue;
    ++chunk_count;
    if (chunk->resident()) ++resident;
    if (chunk->resident() && chunk->in_use()) ++in_compute;
  }
  return fmt::format(
      "chunk manager: {} chunks of {} clients, {} chunks ({}) on the device ({} in compute), {} "
      "on the host",
      chunk_count, clients_.size(), resident, format_bytes(resident_bytes_), in_compute,
      format_bytes(static_cast<std::size_t>(stats_.chunk_bytes_host)));
}

}  // namespace spillway
