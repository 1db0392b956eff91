// ChunkPacker: where a tensor goes in its group's chunks, the one packing
// rule that the chunk manager (chunk_layout.cc) and the chunk-size search
// (tools/chunksize) both follow. Standard library only.
//
// Note [Packing tensors]
// Each client keeps one list of chunks per (kind, slot), so a phase of
// training (the forward reading params, the optimizer reading exp_avg)
// touches few chunks, and removing a client frees whole chunks.
//  - A tensor joins one of the group's last kOpenChunks open chunks, at the
//    next kTensorAlignment boundary: the one it leaves the least room in
//    (best fit), so a tensor that does not fit the newest chunk still fills
//    the gap an earlier one left, and a later small one fills that chunk's.
//    Only the last few are open, so a tensor sits near its neighbours in
//    registration order and a phase still touches few chunks. (Two: best
//    fit takes the demo GPT from 18 chunks of 2 MiB to 14, and more open
//    chunks save none on the models measured; docs/benchmarks.md.)
//  - When none holds it, it opens a new chunk. A tensor larger than
//    chunk_size gets a chunk of exactly its size, which nothing joins.
//  - A chunk's capacity is what its tensors need (the end of its last
//    tensor), rounded up to kChunkRoundBytes as the caching allocator rounds
//    a block, never more than chunk_size rounded. It grows as tensors join,
//    which is sound only while the chunk has no payload: the chunk manager
//    stops offering a chunk once it has bytes (Note [Sealed chunks] in
//    chunk_layout.cc). So a group's last chunk's host copy is not a whole
//    slab of mostly nothing, and chunk_fill_ratio (tensor bytes over chunk
//    bytes) loses only alignment. (The device copy is a whole slab all the
//    same: Note [A device copy is a whole slab] in chunk_manager.cc.)
#pragma once

#include <cstddef>
#include <span>

namespace spillway {

class ChunkPacker {
 public:
  // Where tensors start in a chunk: enough for any vectorized kernel.
  static constexpr std::size_t kTensorAlignment = 256;
  // CachingAllocator::kRoundBytes (chunk_layout.cc checks they agree).
  static constexpr std::size_t kChunkRoundBytes = 512;
  // How many of a group's newest chunks a tensor may join (best fit).
  static constexpr std::size_t kOpenChunks = 2;

  // A chunk of the group that tensors may still join, as its caller sees it.
  struct OpenChunk {
    std::size_t used_bytes = 0;  // end of its last tensor
  };

  enum class Where {
    open_chunk,  // joins open[open_index] at `offset`; its capacity becomes `capacity`
    new_chunk,   // opens a chunk of `capacity`, the group's newest open one
    own_chunk,   // a chunk of `capacity` for it alone, never open
  };
  struct Placement {
    Where where = Where::new_chunk;
    std::size_t open_index = 0;  // open_chunk: index into `open`
    std::size_t offset = 0;      // in its chunk
    std::size_t capacity = 0;    // of its chunk, with the tensor in it
  };

  // chunk_size > 0 (the callers check their input).
  explicit ChunkPacker(std::size_t chunk_size);

  std::size_t chunk_size() const { return chunk_size_; }
  // The largest capacity of an ordinary chunk: chunk_size, rounded.
  std::size_t chunk_capacity() const;
  // The capacity of a chunk whose last tensor ends at `used_bytes`.
  static std::size_t capacity_for(std::size_t used_bytes);

  // Where a tensor of `bytes` goes, given its group's open chunks, oldest
  // first (only the last kOpenChunks are considered; empty when none).
  Placement place(std::size_t bytes, std::span<const OpenChunk> open) const;

 private:
  std::size_t chunk_size_;
};

}  // namespace spillway
