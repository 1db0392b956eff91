// ExpandableSegment: a large-pool segment on a reserved address range that
// grows and shrinks in place (Note [Expandable segments] in
// caching_allocator.cc).
//
// The range [base, base + reserved_bytes) is address space only; pages are
// mapped from its start, [base, base + mapped_bytes), and that prefix is
// covered by the segment's blocks, an address-ordered list whose last block
// is `tail`. Growing maps pages after the tail; shrinking unmaps the whole
// pages of a free tail.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/device/device.h"

namespace spillway {

struct Block;

struct ExpandableSegment {
  std::uintptr_t base = 0;
  std::size_t reserved_bytes = 0;  // address space
  std::size_t mapped_bytes = 0;    // pages mapped, from base; what reserved_bytes counts
  Block* tail = nullptr;           // the block ending at base + mapped_bytes; null when none
  Stream stream;                   // whose blocks it holds (Note [Streams own blocks])
  int size_class = 0;              // which of the stream's segments (Note [Size classes])

  std::uintptr_t mapped_end() const { return base + mapped_bytes; }
};

}  // namespace spillway
