// Block: one contiguous range of a device segment, either handed to a caller
// or cached free. The blocks of a segment form a doubly linked list in address
// order, so a freed block can merge with free neighbours (see Note [Split and
// coalesce] in caching_allocator.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/caching/allocation_owner.h"
#include "allocator/device/device.h"

namespace spillway {

class BlockPool;
struct ExpandableSegment;

enum class BlockState : std::uint8_t {
  free,              // cached in its pool, reusable on its stream
  allocated,         // handed to a caller
  awaiting_streams,  // freed by the caller, still in use on other streams
  unmapped,          // a hole in an expandable segment: no pages, in no pool
};

struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;             // rounded; what allocated_bytes counts
  std::size_t requested_bytes = 0;  // what the caller asked, for the trace
  Stream stream;                    // the stream it was allocated on: its owner
  BlockPool* pool = nullptr;
  ExpandableSegment* expandable = nullptr;  // the segment it lies in, when expandable
  Block* prev = nullptr;                    // neighbours in the same segment, by address
  Block* next = nullptr;
  BlockState state = BlockState::free;
  AllocationOwner owner = AllocationOwner::non_model;  // while allocated
  int pending_events = 0;                              // awaiting_streams: events not yet complete
  std::vector<Stream> used_on_streams;                 // record_stream, other than `stream`
  // Note [Fenced slabs] (caching_allocator.cc): a free mapped slab given back
  // with deallocate_after carries an event after its last users.
  Event fence{};
  bool idle = false;  // ... or with deallocate_idle: nothing queued touches it
  bool fenced() const { return fence.handle != nullptr; }

  // A whole cudaMalloc'd segment, which can be given back with free().
  bool is_whole_segment() const {
    return prev == nullptr && next == nullptr && expandable == nullptr;
  }
  void* pointer() const { return reinterpret_cast<void*>(address); }
};

}  // namespace spillway
