// ChunkPacker: where a tensor goes in its group's chunks, the one packing
// rule that the chunk manager (chunk_layout.cc) and the chunk-size search
// (tools/chunksize) both follow. Standard library only.
//
// Note [Packing tensors]
// Each client keeps one list of chunks per (kind, slot), so a phase of
// training (the forward reading params, the optimizer reading exp_avg)
// touches few chunks, and removing a client frees whole chunks. A tensor
// joins the list's open chunk at the next kTensorAlignment boundary if it
// fits, else opens a new chunk of chunk_size; a tensor larger than
// chunk_size gets a chunk of exactly its size, and the open chunk stays open.
// Capacities are rounded up to kChunkRoundBytes, as the caching allocator
// rounds a slab, so a chunk is exactly one slab.
#pragma once

#include <cstddef>

namespace spillway {

class ChunkPacker {
 public:
  // Where tensors start in a chunk: enough for any vectorized kernel.
  static constexpr std::size_t kTensorAlignment = 256;
  // CachingAllocator::kRoundBytes (chunk_layout.cc checks they agree).
  static constexpr std::size_t kChunkRoundBytes = 512;

  // The group's chunk that tensors may still join, as its caller sees it.
  struct OpenChunk {
    std::size_t capacity = 0;
    std::size_t used_bytes = 0;  // end of its last tensor
  };

  enum class Where {
    open_chunk,  // joins the open chunk at `offset`
    new_chunk,   // opens a chunk of `capacity`, which becomes the open one
    own_chunk,   // a chunk of `capacity` for it alone; the open one stays open
  };
  struct Placement {
    Where where = Where::new_chunk;
    std::size_t offset = 0;    // in its chunk
    std::size_t capacity = 0;  // of its chunk
  };

  // chunk_size > 0 (the callers check their input).
  explicit ChunkPacker(std::size_t chunk_size);

  std::size_t chunk_size() const { return chunk_size_; }
  // An ordinary chunk's capacity: chunk_size, rounded.
  std::size_t chunk_capacity() const;

  // Where a tensor of `bytes` goes, given its group's open chunk (null when
  // the group has none, or when it may take no more tensors).
  Placement place(std::size_t bytes, const OpenChunk* open) const;

 private:
  std::size_t chunk_size_;
};

}  // namespace spillway
