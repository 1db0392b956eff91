// ChunkManager, part two: clients, where tensors sit in chunks, re-laying
// them, removing clients. (The access protocol, residency and pressure:
// chunk_manager.cc; what the manager reports: chunk_reports.cc.)
//
// Where tensors go: ChunkPacker's rule (Note [Packing tensors] in
// chunk_packer.h), with each client's open chunks per (kind, slot).
//
// Note [Sealed chunks]
// Once a chunk has bytes anywhere (its first access), no tensor joins it: a
// newcomer's bytes must read as zeros, but the device copy's tail past
// used_bytes was never written, and moves copy only up to used_bytes. The
// next tensor opens a new chunk. Nor does a sealed chunk grow: its payloads
// were allocated at its capacity, which is final from then on.
#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "allocator/chunk/chunk.h"
#include "allocator/chunk/chunk_manager.h"
#include "allocator/chunk/chunk_packer.h"
#include "allocator/config/format_bytes.h"
#include "allocator/config/invariant.h"

namespace spillway {
namespace {

static_assert(ChunkPacker::kChunkRoundBytes == CachingAllocator::kRoundBytes,
              "a chunk must be exactly one slab");

}  // namespace

// --- Clients and registration --------------------------------------------

ClientId ChunkManager::add_client(std::string name) {
  std::lock_guard lock(mutex_);
  const ClientId id{next_client_++};
  clients_[id].name = std::move(name);
  return id;
}

Status ChunkManager::register_tensor(ClientId client_id, const TensorSpec& spec,
                                     TensorId* tensor_id) {
  *tensor_id = TensorId{};
  std::lock_guard lock(mutex_);
  auto client = clients_.find(client_id);
  if (client == clients_.end()) {
    return fail(Status::invalid_argument,
                fmt::format("register_tensor '{}' for client {}, which does not exist", spec.name,
                            static_cast<unsigned>(client_id)));
  }
  if (spec.dtype_bytes == 0 ||
      spec.element_count > std::numeric_limits<std::size_t>::max() / 2 / spec.dtype_bytes) {
    return fail(Status::invalid_argument,
                fmt::format("register_tensor '{}': {} elements of {} bytes is not a size",
                            spec.name, spec.element_count, spec.dtype_bytes));
  }
  const TensorId id{tensors_.size()};
  auto& tensor = tensors_.emplace_back(std::make_unique<TensorRecord>());
  tensor->client = client_id;
  tensor->bytes = spec.bytes();
  tensor->spec = spec;
  place_tensor_locked(id, *tensor, client->second);
  client->second.tensors.push_back(id);
  *tensor_id = id;
  return Status::ok;
}

// Note [Packing tensors] in chunk_packer.h; a sealed chunk takes no tensor,
// and only an unsealed one may grow.
void ChunkManager::place_tensor_locked(TensorId id, TensorRecord& tensor, Client& client) {
  std::vector<ChunkId>& open =
      client
          .open_chunks[std::make_tuple(tensor.spec.kind, tensor.spec.slot, tensor.spec.pack_group)];
  std::erase_if(open, [&](ChunkId chunk) { return find_chunk_locked(chunk)->sealed; });
  if (open.size() > ChunkPacker::kOpenChunks) {
    open.erase(open.begin(), open.end() - static_cast<std::ptrdiff_t>(ChunkPacker::kOpenChunks));
  }
  std::vector<ChunkPacker::OpenChunk> open_view;
  open_view.reserve(open.size());
  for (ChunkId chunk : open) open_view.push_back({find_chunk_locked(chunk)->used_bytes});
  const ChunkPacker packer(options_.chunk_size);
  const ChunkPacker::Placement placement = packer.place(tensor.bytes, open_view);
  Chunk* chunk = nullptr;
  if (placement.where == ChunkPacker::Where::open_chunk) {
    chunk = find_chunk_locked(open[placement.open_index]);
  } else {
    const bool own = placement.where == ChunkPacker::Where::own_chunk;
    // An open chunk may grow to chunk_capacity(): its inaccessible range is
    // reserved at that size once (address space only).
    chunk = &new_chunk_locked(tensor.client, client, tensor.spec.kind, tensor.spec.slot,
                              own ? placement.capacity : packer.chunk_capacity());
    if (!own) open.push_back(chunk->id);
  }
  SPILLWAY_INVARIANT(!chunk->sealed, "Note [Sealed chunks]: no tensor joins a chunk with bytes");
  SPILLWAY_INVARIANT(placement.capacity >= chunk->capacity, "a chunk only grows while it is open");
  chunk->capacity = placement.capacity;
  chunk->tensors.push_back(id);
  chunk->used_bytes = placement.offset + tensor.bytes;
  tensor.chunk = chunk->id;
  tensor.offset = placement.offset;
}

Chunk& ChunkManager::new_chunk_locked(ClientId client_id, Client& client, TensorKind kind,
                                      std::uint32_t slot, std::size_t reserve_bytes) {
  const ChunkId id{static_cast<std::uint32_t>(chunks_.size())};
  auto& chunk = chunks_.emplace_back(std::make_unique<Chunk>());
  chunk->id = id;
  chunk->client = client_id;
  chunk->kind = kind;
  chunk->slot = slot;
  if (options_.strict_residency) chunk->inaccessible = InaccessibleMapping(reserve_bytes);
  client.chunks.push_back(id);
  return *chunk;
}

// Both copies, the events and the policy's record go; the Chunk object
// stays until the caller resets it.
void ChunkManager::free_chunk_locked(Chunk& chunk) {
  release_payloads_locked(chunk);
  chunk.inaccessible = InaccessibleMapping();
  notify_locked(chunk);  // every address is null now
  mover_.forget(chunk.moves);
  policy_->on_removed(chunk.id);
}

Status ChunkManager::remove_client(ClientId client_id) {
  std::lock_guard lock(mutex_);
  auto client = clients_.find(client_id);
  if (client == clients_.end()) {
    return fail(Status::invalid_argument, fmt::format("remove_client {}, which does not exist",
                                                      static_cast<unsigned>(client_id)));
  }
  for (ChunkId id : client->second.chunks) {
    const Chunk& chunk = *find_chunk_locked(id);
    if (chunk.in_use()) {
      return fail(Status::invalid_argument,
                  fmt::format("remove_client '{}': its tensors are still acquired. {}",
                              client->second.name, describe_in_use_locked()));
    }
  }
  for (ChunkId id : client->second.chunks) {
    free_chunk_locked(*find_chunk_locked(id));
    chunks_[static_cast<std::size_t>(id)].reset();
  }
  for (TensorId id : client->second.tensors) tensors_[static_cast<std::size_t>(id)].reset();
  clients_.erase(client);
  return Status::ok;
}

// --- Re-laying -------------------------------------------------------------

Status ChunkManager::relayout(ClientId client_id, std::span<const TensorId> order) {
  std::lock_guard lock(mutex_);
  auto found = clients_.find(client_id);
  if (found == clients_.end()) {
    return fail(Status::invalid_argument, fmt::format("relayout of client {}, which does not exist",
                                                      static_cast<unsigned>(client_id)));
  }
  Client& client = found->second;
  for (ChunkId id : client.chunks) {
    if (find_chunk_locked(id)->in_use()) {
      return fail(Status::invalid_argument,
                  fmt::format("relayout of client '{}' while its tensors are acquired. {}",
                              client.name, describe_in_use_locked()));
    }
  }
  // Every chunk's bytes to the host, and every move finished, so the host
  // copies can be read here.
  for (ChunkId id : client.chunks) {
    Chunk& chunk = *find_chunk_locked(id);
    if (chunk.dirty()) {
      if (Status status = write_back_locked(chunk); status != Status::ok) return status;
    }
  }
  for (ChunkId id : client.chunks) mover_.wait_for_moves(find_chunk_locked(id)->moves);

  // The new order: those named (once each, this client's only), then the rest.
  std::vector<TensorId> new_order;
  std::unordered_set<TensorId> placed;
  for (TensorId id : order) {
    const TensorRecord* tensor = find_tensor_locked(id);
    if (tensor != nullptr && tensor->client == client_id && placed.insert(id).second) {
      new_order.push_back(id);
    }
  }
  for (TensorId id : client.tensors) {
    if (placed.insert(id).second) new_order.push_back(id);
  }

  struct OldPlace {
    const Chunk* chunk;
    std::size_t offset;
  };
  std::vector<OldPlace> old_places;
  old_places.reserve(new_order.size());
  for (TensorId id : new_order) {
    const TensorRecord& tensor = *find_tensor_locked(id);
    old_places.push_back({find_chunk_locked(tensor.chunk), tensor.offset});
  }
  const std::vector<ChunkId> old_chunks = std::move(client.chunks);
  client.chunks.clear();
  client.open_chunks.clear();
  for (TensorId id : new_order) place_tensor_locked(id, *find_tensor_locked(id), client);

  // Copy each tensor's bytes from its old host copy into its new chunk's.
  // (materialize fails only when the host heap itself is exhausted.)
  for (std::size_t i = 0; i < new_order.size(); ++i) {
    TensorRecord& tensor = *find_tensor_locked(new_order[i]);
    Chunk& chunk = *find_chunk_locked(tensor.chunk);
    if (tensor.state == TensorState::hold) ++chunk.held_tensors;
    const OldPlace& old = old_places[i];
    if (!old.chunk->host_current) continue;  // zeros, as the new chunk starts
    if (chunk.location() == Location::none) {
      if (Status status = materialize_locked(chunk); status != Status::ok) return status;
    }
    std::memcpy(static_cast<char*>(chunk.host.data) + tensor.offset,
                static_cast<const char*>(old.chunk->host.data) + old.offset, tensor.bytes);
  }
  for (ChunkId id : old_chunks) {
    Chunk& chunk = *find_chunk_locked(id);
    chunk.tensors.clear();  // they belong to the new chunks now: nothing to notify
    free_chunk_locked(chunk);
    chunks_[static_cast<std::size_t>(id)].reset();
  }
  for (ChunkId id : client.chunks) notify_locked(*find_chunk_locked(id));
  return Status::ok;
}

}  // namespace spillway
