// Packs tensors into chunks by the chunk manager's rule (Note [Packing
// tensors] in allocator/chunk_layout.cc): each (kind, slot) has one open
// chunk; a tensor joins it at the next 256-byte boundary if it fits, else
// opens a new chunk of chunk_size (rounded up to 512 bytes, as the allocator
// rounds a slab); a tensor larger than chunk_size gets a chunk of exactly its
// size (rounded the same way) and the open chunk stays open.
//
// Waste is what that leaves unused: chunk capacity minus tensor bytes
// (alignment padding and the room a tensor that did not fit left behind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tools/chunksize/model_tensors.h"
#include "tracer/planner/step_trace.h"

namespace spillway::chunksize {

// Mirrors of allocator constants (kTensorAlignment in chunk_layout.cc,
// CachingAllocator::kRoundBytes), kept here so this stays below the allocator.
inline constexpr std::uint64_t kTensorAlignment = 256;
inline constexpr std::uint64_t kChunkRoundBytes = 512;

struct PackedChunk {
  DataKind kind = DataKind::param;
  std::uint32_t slot = 0;
  std::uint64_t capacity = 0;
  std::uint64_t tensor_bytes = 0;  // sum of its tensors' bytes (no padding)
  bool own = false;                // a tensor larger than chunk_size alone
};

struct Packing {
  std::uint64_t chunk_size = 0;               // as asked, before rounding
  std::vector<PackedChunk> chunks;            // id = index, in creation order
  std::vector<plan::PlanChunk> tensor_chunk;  // per tensor, in the order given

  std::uint64_t capacity_bytes() const;
  std::uint64_t tensor_bytes() const;
  std::uint64_t waste_bytes() const { return capacity_bytes() - tensor_bytes(); }
  std::size_t own_chunks() const;  // chunks a single oversized tensor got
};

Packing pack_tensors(const std::vector<ModelTensor>& tensors, std::uint64_t chunk_size);

}  // namespace spillway::chunksize
