// BlockAddressMap: the blocks handed to callers, by address.
//
// deallocate and record_stream look a pointer up on every call, so this is an
// open-addressing table (linear probing, backward-shift deletion) rather than
// a node-based map: a lookup is a multiply and, almost always, one cache line.
// Addresses are never 0, so 0 marks an empty slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/caching/block.h"

namespace spillway {

class BlockAddressMap {
 public:
  BlockAddressMap();

  void insert(Block* block);
  Block* find(std::uintptr_t address) const;
  // Removes and returns the block at `address`; null when there is none.
  Block* take(std::uintptr_t address);
  std::size_t size() const { return count_; }

  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (const Slot& slot : slots_) {
      if (slot.address != 0) visit(slot.block);
    }
  }

 private:
  struct Slot {
    std::uintptr_t address = 0;
    Block* block = nullptr;
  };

  std::size_t home_slot(std::uintptr_t address) const {
    // Fibonacci hashing: the multiply moves the varying middle bits of an
    // aligned address into the top bits, which pick the slot.
    return static_cast<std::size_t>((address * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::size_t find_slot(std::uintptr_t address) const;  // slots_.size() when absent
  void grow();

  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 0;
  std::size_t count_ = 0;
};

}  // namespace spillway
