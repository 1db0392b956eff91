// BlockPool: the free blocks of one pool (small or large), for best fit per
// stream.
//
// One ordered set keyed by (stream, size, address) serves every stream: the
// best fit for (stream, size) is the first entry at or after that key, if it
// still belongs to the stream. Ties go to the lowest address, which packs
// allocations towards segment starts and leaves whole segments free.
//
// Splits and merges change a free block's range; update_range changes it in
// place when the block keeps its position in the order (the usual case: a
// slab's one big free block shrinking and growing back), so the hot path
// rarely rebalances the tree. Set nodes that are removed are kept for the
// next insert, so cached allocations allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "allocator/caching/block.h"

namespace spillway {

class BlockPool {
 public:
  enum class Kind { small, large };

  explicit BlockPool(Kind kind);

  Kind kind() const { return kind_; }

  // The smallest free block of at least `size` bytes owned by `stream`
  // (it stays in the pool); null when there is none.
  Block* best_fit(Stream stream, std::size_t size) const;
  void insert(Block* block);
  void remove(Block* block);
  // Gives a free block in the pool a new range, keeping the order.
  void update_range(Block* block, std::uintptr_t address, std::size_t size);

  // Whether handing out `size` bytes of `block` should leave the rest as a
  // free block of its own. PyTorch's rule: a small-pool remainder is worth
  // keeping from one rounding unit up; a large-pool one only above 1 MiB
  // (smaller large-pool remainders would only serve small requests, which
  // the small pool serves). The free tail of an expandable segment is kept
  // from one rounding unit up: the segment's next growth joins it.
  bool should_split(const Block& block, std::size_t size) const;

  // Free blocks spanning a whole segment, i.e. segments that can be returned.
  std::vector<Block*> whole_segments() const;
  std::size_t largest_block_bytes() const;
  std::size_t free_bytes() const;
  std::size_t block_count() const { return free_blocks_.size(); }

 private:
  struct Key {
    std::uintptr_t stream;
    std::size_t size;
    std::uintptr_t address;
  };
  struct BlockOrder {
    using is_transparent = void;
    static Key key(const Block* block) {
      return {reinterpret_cast<std::uintptr_t>(block->stream.handle), block->size, block->address};
    }
    static bool less(const Key& a, const Key& b) {
      if (a.stream != b.stream) return a.stream < b.stream;
      if (a.size != b.size) return a.size < b.size;
      return a.address < b.address;
    }
    bool operator()(const Block* a, const Block* b) const { return less(key(a), key(b)); }
    bool operator()(const Block* a, const Key& b) const { return less(key(a), b); }
    bool operator()(const Key& a, const Block* b) const { return less(a, key(b)); }
  };
  using FreeSet = std::set<Block*, BlockOrder>;

  void keep_spare_node(FreeSet::node_type node);

  Kind kind_;
  FreeSet free_blocks_;
  std::vector<FreeSet::node_type> spare_nodes_;
};

}  // namespace spillway
