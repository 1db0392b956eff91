// caching_allocator_impl.h: CachingAllocator's state and its steps, shared
// by caching_allocator.cc (the pools, the fallback chain, slabs) and
// expandable_segments.cc (Note [Expandable segments]). Private to
// allocator/caching.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "allocator/caching/block.h"
#include "allocator/caching/block_address_map.h"
#include "allocator/caching/block_pool.h"
#include "allocator/caching/caching_allocator.h"
#include "allocator/caching/deferred_frees.h"
#include "allocator/caching/expandable_segment.h"
#include "allocator/device/event_pool.h"

namespace spillway {

struct CachingAllocator::Impl {
  // What one allocate call needs, worked out once.
  struct Request {
    AllocationOwner owner = AllocationOwner::non_model;
    std::size_t asked_bytes = 0;
    std::size_t size = 0;  // rounded to kRoundBytes
    Stream stream;
    BlockPool* pool = nullptr;
    std::size_t segment_bytes = 0;      // a new segment: a slab, or an oversize segment
    std::size_t min_segment_bytes = 0;  // the smallest that fits (Note [Segments near the budget])
    // Which expandable segment of the stream serves it (Note [Size classes]):
    // 0: none; 1: the mid-size segment (the one class that has one today).
    int expandable_class = 0;
  };

  // Why the latest attempt to reserve a segment failed, for the error.
  struct ReserveFailure {
    bool over_budget = false;
    Status device_status = Status::ok;
    std::string device_error;
  };

  static std::size_t round_up(std::size_t value, std::size_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
  }
  static std::uintptr_t stream_id(Stream stream) {
    return reinterpret_cast<std::uintptr_t>(stream.handle);
  }

  Impl(Device& device_to_use, CachingAllocatorOptions options, TraceSink* trace_sink);
  ~Impl();

  Status allocate(void** ptr, std::size_t bytes, Stream stream, AllocationOwner owner);
  Status allocate_over_budget(void** ptr, std::size_t bytes, Stream stream);
  // Note [Fenced slabs]: `users`, the stream whose queued work is the block's
  // last; `idle`, none.
  Status deallocate(void* ptr, std::optional<Stream> users = std::nullopt, bool idle = false);
  Status record_stream(void* ptr, Stream stream);
  void empty_cache();
  void set_budget_bytes(std::size_t bytes);

  bool make_request(std::size_t bytes, Stream stream, Request* request);
  // Steps 1 (cached block) and 3 (release cached segments, new segment) of
  // Note [The allocation fallback chain], with the mutex held.
  Block* retry_locked(const Request& request, ReserveFailure* failure);
  // `past_budget`: Note [Segments past the budget].
  Block* reserve_segment_locked(const Request& request, ReserveFailure* failure,
                                bool past_budget = false);
  // Note [Expandable segments]: maps pages after the stream's segment's
  // tail; null when the budget or the device has no room, or the segment's
  // address range is full.
  Block* grow_segment_locked(const Request& request, std::size_t left, ReserveFailure* failure);
  ExpandableSegment* expandable_segment_locked(Stream stream, int size_class, std::size_t bytes);
  void shrink_segments_locked();
  void unmap_free_pages_locked(ExpandableSegment* segment, Block* block);
  void drop_trailing_holes_locked(ExpandableSegment* segment);
  Block* fill_hole_locked(ExpandableSegment* segment, const Request& request, std::size_t left);
  void release_address_range_locked(ExpandableSegment* segment);
  void* hand_out_locked(Block* block, const Request& request);
  void release_allocated_locked(Block* block);
  void return_to_pool_locked(Block* block);
  // Which free memory goes back (Note [Fenced slabs]): mapped slabs that need
  // no wait; every mapped slab (each waits for its fence) and expandable
  // segments' free pages; or all that and every free whole segment.
  enum class ReleaseScope { ready_slabs, mapped_slabs, all };
  // True when that freed anything.
  bool release_free_segments_locked(ReleaseScope scope = ReleaseScope::all);
  void note_release_wait(std::uint64_t start_ns) {
    const std::uint64_t now_ns = device.now_ns();
    if (now_ns > start_ns) release_wait_ns.fetch_add(now_ns - start_ns, std::memory_order_relaxed);
  }
  void release_outgrown_segments_locked(const Request& request);
  // A free block that is a whole segment (cudaMalloc'd, or a mapped slab)
  // goes back to the device.
  void release_segment_locked(Block* block);
  // Note [Fenced slabs]: a slab on mapped pages; null where the device has
  // no virtual memory or refuses it (a cudaMalloc'd slab is tried then).
  void* reserve_mapped_slab_locked(std::size_t bytes);
  void drop_fence_locked(Block* block);
  // Cheap when nothing is deferred: called on every allocate and deallocate.
  void collect_completed_frees_if_any_locked() {
    if (!deferred_frees.empty()) collect_completed_frees_locked();
  }
  void collect_completed_frees_locked();
  bool wait_for_deferred_frees();
  std::vector<PressureHandler*> pressure_handlers_snapshot() const;
  Status fail_out_of_memory(const Request& request, const ReserveFailure& failure,
                            std::string reason);
  Status fail_unknown_pointer(const char* operation, void* ptr);

  Block* new_block_locked();
  void recycle_block_locked(Block* block);
  void trace_locked(TraceEventKind kind, Stream stream, std::uintptr_t address, std::size_t size) {
    if (trace != nullptr) trace->record({device.now_ns(), kind, stream_id(stream), address, size});
  }
  std::size_t reserved_bytes_locked() const {
    return static_cast<std::size_t>(stats.reserved_bytes.current);
  }
  StatArray& allocated_bytes_of(AllocationOwner owner) {
    return owner == AllocationOwner::model ? stats.allocated_bytes_model
                                           : stats.allocated_bytes_non_model;
  }

  Device& device;
  TraceSink* const trace;
  const std::size_t large_slab_bytes;
  const bool size_classes;       // expandable_segments: Note [Size classes]
  const std::size_t page_bytes;  // 0: slabs only (Note [Expandable segments])
  std::atomic<std::size_t> budget_bytes;
  // Note [Time spent giving memory back]: nanoseconds in device frees and unmaps.
  std::atomic<std::uint64_t> release_wait_ns{0};
  // Note [Room a prefetch takes early]: the non-model high-water mark since
  // the last take_non_model_high_water().
  std::int64_t non_model_high_water = 0;

  mutable std::mutex mutex;
  BlockPool small_pool{BlockPool::Kind::small};
  BlockPool large_pool{BlockPool::Kind::large};
  BlockAddressMap allocated_blocks;
  DeferredFrees deferred_frees;
  std::unordered_map<std::uintptr_t, std::size_t> segments;  // base address -> bytes
  // Note [Fenced slabs]: the mapped slabs among them, and their fences' events.
  std::unordered_set<std::uintptr_t> mapped_slabs;
  EventPool fences{device};
  // Stream -> its expandable segment, while it has pages mapped.
  std::map<std::pair<std::uintptr_t, int>, std::unique_ptr<ExpandableSegment>> expandable_segments;
  std::deque<Block> block_storage;  // stable addresses
  std::vector<Block*> spare_blocks;
  std::vector<PressureHandler*> pressure_handlers;
  Stats stats;
};

}  // namespace spillway
