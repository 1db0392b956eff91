// ExpandableSegment: a large-pool segment on a reserved address range that
// grows and shrinks in place (Note [Expandable segments] in
// caching_allocator.cc).
//
// The range [base, base + reserved_bytes) is address space only. Its prefix
// [base, base + end_bytes) is covered by the segment's blocks, an
// address-ordered list whose last block is `tail`; their pages are mapped,
// except those of `unmapped` blocks (holes, page-aligned, never the tail).
// Growing maps the pages a request lacks in a hole or after the tail;
// shrinking unmaps the whole pages of free blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/device/device.h"

namespace spillway {

struct Block;

struct ExpandableSegment {
  std::uintptr_t base = 0;
  std::size_t reserved_bytes = 0;  // address space
  std::size_t end_bytes = 0;       // the blocks' extent, from base
  std::size_t mapped_bytes = 0;    // pages mapped; what reserved_bytes counts
  std::size_t holes = 0;           // unmapped blocks
  Block* tail = nullptr;           // the block ending at base + end_bytes; null when none
  Stream stream;                   // whose blocks it holds (Note [Streams own blocks])
  int size_class = 0;              // which of the stream's segments (Note [Size classes])

  std::uintptr_t end() const { return base + end_bytes; }
};

}  // namespace spillway
