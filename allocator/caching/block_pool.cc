#include "allocator/caching/block_pool.h"

#include <algorithm>

#include "allocator/caching/caching_allocator.h"

namespace spillway {
namespace {

// Enough for the blocks a burst of frees returns; beyond it nodes go back to
// the heap.
constexpr std::size_t kMaxSpareNodes = 256;

}  // namespace

BlockPool::BlockPool(Kind kind) : kind_(kind) { spare_nodes_.reserve(kMaxSpareNodes); }

Block* BlockPool::best_fit(Stream stream, std::size_t size) const {
  const Key wanted{reinterpret_cast<std::uintptr_t>(stream.handle), size, 0};
  auto found = free_blocks_.lower_bound(wanted);
  if (found == free_blocks_.end() || (*found)->stream != stream) return nullptr;
  return *found;
}

void BlockPool::insert(Block* block) {
  if (spare_nodes_.empty()) {
    free_blocks_.insert(block);
    return;
  }
  FreeSet::node_type node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  node.value() = block;
  free_blocks_.insert(std::move(node));
}

void BlockPool::remove(Block* block) { keep_spare_node(free_blocks_.extract(block)); }

void BlockPool::update_range(Block* block, std::uintptr_t address, std::size_t size) {
  const auto position = free_blocks_.find(block);
  const Key updated{reinterpret_cast<std::uintptr_t>(block->stream.handle), size, address};
  // A key that moves down can only pass the previous entry; up, the next.
  const bool keeps_position =
      BlockOrder::less(updated, BlockOrder::key(block))
          ? position == free_blocks_.begin() ||
                BlockOrder::less(BlockOrder::key(*std::prev(position)), updated)
          : std::next(position) == free_blocks_.end() ||
                BlockOrder::less(updated, BlockOrder::key(*std::next(position)));
  if (keeps_position) {
    // The set orders blocks through these fields, and its order still holds.
    block->address = address;
    block->size = size;
    return;
  }
  FreeSet::node_type node = free_blocks_.extract(position);
  block->address = address;
  block->size = size;
  free_blocks_.insert(std::move(node));
}

void BlockPool::keep_spare_node(FreeSet::node_type node) {
  if (node && spare_nodes_.size() < kMaxSpareNodes) spare_nodes_.push_back(std::move(node));
}

bool BlockPool::should_split(const Block& block, std::size_t size) const {
  const std::size_t remainder = block.size - size;
  // An expandable segment's tail is worth keeping at any size: it grows.
  if (kind_ == Kind::small || (block.expandable != nullptr && block.next == nullptr))
    return remainder >= CachingAllocator::kRoundBytes;
  return remainder > CachingAllocator::kSmallRequestMaxBytes;
}

std::vector<Block*> BlockPool::whole_segments() const {
  std::vector<Block*> segments;
  for (Block* block : free_blocks_) {
    if (block->is_whole_segment()) segments.push_back(block);
  }
  return segments;
}

std::size_t BlockPool::largest_block_bytes() const {
  std::size_t largest = 0;
  for (const Block* block : free_blocks_) largest = std::max(largest, block->size);
  return largest;
}

std::size_t BlockPool::free_bytes() const {
  std::size_t bytes = 0;
  for (const Block* block : free_blocks_) bytes += block->size;
  return bytes;
}

}  // namespace spillway
