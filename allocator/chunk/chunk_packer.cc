#include "allocator/chunk/chunk_packer.h"

#include <limits>

namespace spillway {
namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

ChunkPacker::ChunkPacker(std::size_t chunk_size) : chunk_size_(chunk_size) {}

std::size_t ChunkPacker::chunk_capacity() const { return round_up(chunk_size_, kChunkRoundBytes); }

std::size_t ChunkPacker::capacity_for(std::size_t used_bytes) {
  return round_up(used_bytes, kChunkRoundBytes);
}

// Note [Packing tensors]
ChunkPacker::Placement ChunkPacker::place(std::size_t bytes,
                                          std::span<const OpenChunk> open) const {
  if (bytes > chunk_size_) return {Where::own_chunk, 0, 0, capacity_for(bytes)};
  const std::size_t first = open.size() > kOpenChunks ? open.size() - kOpenChunks : 0;
  const std::size_t limit = chunk_capacity();
  Placement best{Where::new_chunk, 0, 0, capacity_for(bytes)};
  std::size_t best_room = std::numeric_limits<std::size_t>::max();
  // Newest first, so of equal fits the tensor joins the newest chunk.
  for (std::size_t i = open.size(); i-- > first;) {
    const std::size_t offset = round_up(open[i].used_bytes, kTensorAlignment);
    if (offset + bytes > limit) continue;
    const std::size_t room = limit - (offset + bytes);
    if (room < best_room) {
      best_room = room;
      best = {Where::open_chunk, i, offset, capacity_for(offset + bytes)};
    }
  }
  return best;
}

}  // namespace spillway
