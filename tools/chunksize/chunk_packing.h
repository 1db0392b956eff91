// Packs tensors into chunks with the chunk manager's own packer
// (allocator/chunk/chunk_packer.h, Note [Packing tensors]): each (kind, slot) has
// its open chunks, as each client's (kind, slot) has in the chunk manager
// before any chunk has bytes.
//
// Waste is what that leaves unused: chunk capacity minus tensor bytes
// (alignment padding and the room a tensor that did not fit left behind);
// fill_ratio() is tensor bytes over capacity, the chunk_fill_ratio statistic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tools/chunksize/model_tensors.h"
#include "tracer/planner/step_trace.h"

namespace spillway::chunksize {

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
  std::vector<std::uint64_t> tensor_offset;   // per tensor: its offset in its chunk

  std::uint64_t capacity_bytes() const;
  std::uint64_t tensor_bytes() const;
  std::uint64_t waste_bytes() const { return capacity_bytes() - tensor_bytes(); }
  double fill_ratio() const;       // tensor bytes over capacity; 0 when there are no chunks
  std::size_t own_chunks() const;  // chunks a single oversized tensor got
};

Packing pack_tensors(const std::vector<ModelTensor>& tensors, std::uint64_t chunk_size);

}  // namespace spillway::chunksize
