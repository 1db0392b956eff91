#include "allocator/caching/block_address_map.h"

#include <bit>
#include <utility>

namespace spillway {
namespace {

constexpr std::size_t kInitialSlots = 1024;

}  // namespace

BlockAddressMap::BlockAddressMap()
    : slots_(kInitialSlots),
      mask_(kInitialSlots - 1),
      shift_(64 - static_cast<unsigned>(std::countr_zero(kInitialSlots))) {}

std::size_t BlockAddressMap::find_slot(std::uintptr_t address) const {
  for (std::size_t i = home_slot(address);; i = (i + 1) & mask_) {
    if (slots_[i].address == address) return i;
    if (slots_[i].address == 0) return slots_.size();
  }
}

Block* BlockAddressMap::find(std::uintptr_t address) const {
  if (address == 0) return nullptr;
  const std::size_t i = find_slot(address);
  return i == slots_.size() ? nullptr : slots_[i].block;
}

void BlockAddressMap::insert(Block* block) {
  // At most half full keeps probe sequences short.
  if (2 * (count_ + 1) > slots_.size()) grow();
  std::size_t i = home_slot(block->address);
  while (slots_[i].address != 0) i = (i + 1) & mask_;
  slots_[i] = {block->address, block};
  ++count_;
}

Block* BlockAddressMap::take(std::uintptr_t address) {
  if (address == 0) return nullptr;
  std::size_t hole = find_slot(address);
  if (hole == slots_.size()) return nullptr;
  Block* block = slots_[hole].block;
  // Backward-shift deletion: move later entries of the probe run into the
  // hole unless that would put them before their home slot.
  for (std::size_t next = (hole + 1) & mask_; slots_[next].address != 0;
       next = (next + 1) & mask_) {
    const std::size_t home = home_slot(slots_[next].address);
    const bool home_between_hole_and_next =
        hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
    if (home_between_hole_and_next) continue;
    slots_[hole] = slots_[next];
    hole = next;
  }
  slots_[hole] = Slot{};
  --count_;
  return block;
}

void BlockAddressMap::grow() {
  std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(slots_.size() * 2));
  mask_ = slots_.size() - 1;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(slots_.size()));
  count_ = 0;
  for (const Slot& slot : old) {
    if (slot.address != 0) insert(slot.block);
  }
}

}  // namespace spillway
