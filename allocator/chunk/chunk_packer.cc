#include "allocator/chunk/chunk_packer.h"

namespace spillway {
namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

ChunkPacker::ChunkPacker(std::size_t chunk_size) : chunk_size_(chunk_size) {}

std::size_t ChunkPacker::chunk_capacity() const { return round_up(chunk_size_, kChunkRoundBytes); }

ChunkPacker::Placement ChunkPacker::place(std::size_t bytes, const OpenChunk* open) const {
  if (bytes > chunk_size_) return {Where::own_chunk, 0, round_up(bytes, kChunkRoundBytes)};
  if (open != nullptr) {
    const std::size_t offset = round_up(open->used_bytes, kTensorAlignment);
    if (offset + bytes <= open->capacity) return {Where::open_chunk, offset, open->capacity};
  }
  return {Where::new_chunk, 0, chunk_capacity()};
}

}  // namespace spillway
