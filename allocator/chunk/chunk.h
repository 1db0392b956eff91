// Chunk and TensorRecord: the chunk manager's bookkeeping for one chunk and
// one registered tensor. Plain data, guarded by the manager's lock; the
// rules that change them live in chunk_manager.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/chunk/chunk_mover.h"
#include "allocator/chunk/chunk_types.h"
#include "allocator/chunk/host_pool.h"
#include "allocator/chunk/inaccessible_mapping.h"
#include "allocator/device/device.h"

namespace spillway {

struct TensorRecord {
  ClientId client{};
  ChunkId chunk{};
  std::size_t offset = 0;
  std::size_t bytes = 0;
  TensorSpec spec;
  TensorState state = TensorState::free;
  // Outstanding acquires (several threads may use one tensor at once).
  std::uint32_t device_users = 0;
  std::uint32_t host_users = 0;
  bool alive = true;  // false once its client is removed or it was re-laid
};

struct Chunk {
  ChunkId id{};
  ClientId client{};
  TensorKind kind = TensorKind::param;
  std::uint32_t slot = 0;
  std::size_t capacity = 0;
  std::size_t used_bytes = 0;  // end of the last tensor: what a move copies
  std::vector<TensorId> tensors;
  // Note [Sealed chunks]: once a chunk has bytes, no tensor joins it.
  bool sealed = false;

  // Payloads. The bytes are current on the device, on the host, or both
  // (clean); dirty = on the device only.
  void* device_data = nullptr;
  HostBlock host;
  bool device_current = false;
  bool host_current = false;

  // Its payloads' moves in flight (chunk_mover.h).
  PayloadMoves moves;

  // Outstanding acquires of this chunk's tensors.
  std::uint32_t device_users = 0;
  std::uint32_t host_users = 0;
  std::uint32_t held_tensors = 0;  // tensors in state hold

  InaccessibleMapping inaccessible;  // strict_residency only

  bool resident() const { return device_data != nullptr; }
  bool dirty() const { return device_current && !host_current; }
  bool in_use() const { return device_users != 0 || host_users != 0; }
  Location location() const {
    if (device_data != nullptr) return Location::device;
    if (host_current) return Location::host;
    return Location::none;
  }
  TensorState state() const {
    if (in_use()) return TensorState::compute;
    return held_tensors != 0 ? TensorState::hold : TensorState::free;
  }
};

}  // namespace spillway
