// Expandable segments: CachingAllocator's address ranges that grow and
// shrink by device pages.
//
// Note [Expandable segments]
// A segment made with cudaMalloc keeps its size for life, so a free block at
// its end serves only requests that fit in it. An expandable segment (after
// PyTorch's expandable_segments) is an address range reserved once per
// stream (ExpandableSegment, expandable_segment.h; the budget's size, at most
// 1 TiB), with device pages mapped from its start (Device::map_pages, Note
// [Virtual memory pages] in device.cc). When no free block fits, the segment
// grows at its end by the pages the request lacks: a free tail block grows in
// place (the request then splits it as usual), otherwise the new pages are a
// new tail block. Reserved bytes are mapped bytes, so the budget, the stats
// and segment_alloc/segment_free trace events (one per mapping, with its
// range) count pages. Releasing cached memory (step 3 of the fallback chain,
// empty_cache, a budget cut) unmaps the whole pages inside every free block:
// the pages become a hole, an `unmapped` block in the segment's list but in
// no pool, joined with holes beside it; what is left of the free block
// either side (the part of a page it shares with a used neighbour) stays
// free. Pages at the segment's end, and holes left at the end, leave the
// segment; one left with no blocks gives back its address range. Before
// growing at its end, a segment tries its holes: one that, with its free
// neighbours, holds the request gets the pages the request lacks mapped and
// joins them, so address space is reused and the memory stays where it was.
// Blocks carry their segment (Block::expandable) so a merge that absorbs the
// tail moves `tail`. A mapping the device refuses falls back to a slab, so a
// device without virtual memory, or with its address range used up, keeps
// working.
#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "allocator/caching/caching_allocator_impl.h"
#include "allocator/config/format_bytes.h"

namespace spillway {
namespace {

// An expandable segment's address range: the budget, capped where the budget
// is "unlimited" (address space is plentiful, not endless: 128 TiB a process).
constexpr std::size_t kMaxAddressRangeBytes = std::size_t{1} << 40;  // 1 TiB

}  // namespace

// Note [Expandable segments]
Block* CachingAllocator::Impl::grow_segment_locked(const Request& request, std::size_t left,
                                                   ReserveFailure* failure) {
  ExpandableSegment* segment = expandable_segment_locked(
      request.stream, request.expandable_class,
      std::min(budget_bytes.load(std::memory_order_relaxed), kMaxAddressRangeBytes));
  if (segment == nullptr) return nullptr;
  if (segment->holes > 0) {
    if (Block* block = fill_hole_locked(segment, request, left)) return block;
  }
  Block* tail = segment->tail;
  const bool tail_is_free = tail != nullptr && tail->state == BlockState::free;
  const std::size_t reused = tail_is_free ? tail->size : 0;  // the free tail grows
  const std::size_t bytes = round_up(request.size - reused, page_bytes);
  if (bytes > left) {
    *failure = ReserveFailure{.over_budget = true, .device_status = Status::ok, .device_error = {}};
    if (segment->end_bytes == 0) release_address_range_locked(segment);
    return nullptr;
  }
  const std::uintptr_t address = segment->end();
  const bool range_full = bytes > segment->reserved_bytes - segment->end_bytes;
  const Status status = range_full ? Status::out_of_memory
                                   : device.map_pages(reinterpret_cast<void*>(address), bytes);
  if (status != Status::ok) {
    *failure = ReserveFailure{
        .over_budget = false,
        .device_status = status,
        .device_error = range_full
                            ? fmt::format("the expandable segment's address range of {} is full",
                                          format_bytes(segment->reserved_bytes))
                            : device.last_error()};
    if (segment->end_bytes == 0) release_address_range_locked(segment);
    return nullptr;
  }
  segment->mapped_bytes += bytes;
  segment->end_bytes += bytes;
  stats.reserved_bytes.increase(static_cast<std::int64_t>(bytes));
  ++stats.num_device_alloc;
  trace_locked(TraceEventKind::segment_alloc, request.stream, address, bytes);
  if (tail_is_free) {
    tail->pool->update_range(tail, tail->address, tail->size + bytes);
    return tail;
  }
  Block* block = new_block_locked();
  block->address = address;
  block->size = bytes;
  block->stream = request.stream;
  block->pool = request.pool;
  block->expandable = segment;
  block->prev = tail;
  if (tail != nullptr) tail->next = block;
  segment->tail = block;
  request.pool->insert(block);
  return block;
}

// The stream's segment, with an address range reserved for it if it has
// none; null where the device refuses one.
ExpandableSegment* CachingAllocator::Impl::expandable_segment_locked(Stream stream, int size_class,
                                                                     std::size_t bytes) {
  auto [it, inserted] = expandable_segments.try_emplace({stream_id(stream), size_class});
  if (!inserted) return it->second.get();
  auto segment = std::make_unique<ExpandableSegment>();
  segment->reserved_bytes = round_up(bytes, page_bytes);
  segment->stream = stream;
  segment->size_class = size_class;
  void* base = nullptr;
  if (device.reserve_address_range(&base, segment->reserved_bytes) != Status::ok) {
    expandable_segments.erase(it);
    return nullptr;
  }
  segment->base = reinterpret_cast<std::uintptr_t>(base);
  stats.segment.increase(1);
  it->second = std::move(segment);
  return it->second.get();
}

void CachingAllocator::Impl::release_address_range_locked(ExpandableSegment* segment) {
  device.release_address_range(reinterpret_cast<void*>(segment->base), segment->reserved_bytes);
  stats.segment.decrease(1);
  expandable_segments.erase({stream_id(segment->stream), segment->size_class});
}

// Maps the pages a request lacks in a hole whose free neighbours and itself
// hold it; the free block that then holds it (in the pool), or null when no
// hole serves (Note [Expandable segments]).
Block* CachingAllocator::Impl::fill_hole_locked(ExpandableSegment* segment, const Request& request,
                                                std::size_t left) {
  auto is_free = [](const Block* b) { return b != nullptr && b->state == BlockState::free; };
  for (Block* hole = segment->tail; hole != nullptr; hole = hole->prev) {
    if (hole->state != BlockState::unmapped) continue;
    Block* prev = is_free(hole->prev) ? hole->prev : nullptr;
    Block* next = is_free(hole->next) ? hole->next : nullptr;
    const std::size_t available =
        (prev != nullptr ? prev->size : 0) + hole->size + (next != nullptr ? next->size : 0);
    if (available < request.size) continue;
    const std::uintptr_t start = prev != nullptr ? prev->address : hole->address;
    const std::uintptr_t hole_end = hole->address + hole->size;
    const std::uintptr_t map_end = std::min(
        hole_end, segment->base + round_up(start + request.size - segment->base, page_bytes));
    const std::size_t bytes = map_end - hole->address;
    if (bytes > left) continue;
    if (device.map_pages(reinterpret_cast<void*>(hole->address), bytes) != Status::ok) continue;
    segment->mapped_bytes += bytes;
    stats.reserved_bytes.increase(static_cast<std::int64_t>(bytes));
    ++stats.num_device_alloc;
    trace_locked(TraceEventKind::segment_alloc, segment->stream, hole->address, bytes);
    const bool whole = map_end == hole_end;
    Block* block = prev;  // the free block that gets the pages
    if (block != nullptr) {
      block->pool->update_range(block, block->address, block->size + bytes);
    } else if (whole) {
      block = hole;
      block->state = BlockState::free;
      block->pool->insert(block);
    } else {
      block = new_block_locked();
      block->address = hole->address;
      block->size = bytes;
      block->stream = hole->stream;
      block->pool = hole->pool;
      block->expandable = segment;
      block->prev = hole->prev;
      block->next = hole;
      if (block->prev != nullptr) block->prev->next = block;
      hole->prev = block;
      block->pool->insert(block);
    }
    if (!whole) {
      hole->address = map_end;
      hole->size = hole_end - map_end;
      return block;
    }
    --segment->holes;
    if (block != hole) {  // the hole is gone: unlink it
      block->next = hole->next;
      if (block->next != nullptr) block->next->prev = block;
      recycle_block_locked(hole);
    }
    if (next != nullptr) {  // and its free neighbour after it joins
      next->pool->remove(next);
      block->next = next->next;
      if (block->next != nullptr) block->next->prev = block;
      if (segment->tail == next) segment->tail = block;
      block->pool->update_range(block, block->address, block->size + next->size);
      recycle_block_locked(next);
    }
    return block;
  }
  return nullptr;
}

// Unmaps the whole pages of every free block of every expandable segment; a
// segment left with no blocks gives back its address range too.
void CachingAllocator::Impl::shrink_segments_locked() {
  std::vector<ExpandableSegment*> emptied;
  for (const auto& [key, segment] : expandable_segments) {
    for (Block* block = segment->tail; block != nullptr;) {
      Block* prev = block->prev;  // what unmapping leaves before `block` stays valid
      if (block->state == BlockState::free) unmap_free_pages_locked(segment.get(), block);
      block = prev;
    }
    drop_trailing_holes_locked(segment.get());
    if (segment->end_bytes == 0) emptied.push_back(segment.get());
  }
  for (ExpandableSegment* segment : emptied) release_address_range_locked(segment);
}

// The segment ends at its last mapped block: holes after it leave it.
void CachingAllocator::Impl::drop_trailing_holes_locked(ExpandableSegment* segment) {
  while (segment->tail != nullptr && segment->tail->state == BlockState::unmapped) {
    Block* hole = segment->tail;
    segment->end_bytes = hole->address - segment->base;
    segment->tail = hole->prev;
    if (hole->prev != nullptr) hole->prev->next = nullptr;
    --segment->holes;
    recycle_block_locked(hole);
  }
}

// Unmaps the whole pages inside a free block. What is left of it either
// side stays free; the pages become a hole (joined with holes beside it),
// or, at the segment's end, leave the segment.
void CachingAllocator::Impl::unmap_free_pages_locked(ExpandableSegment* segment, Block* block) {
  const std::uintptr_t begin = block->address;
  const std::uintptr_t end = begin + block->size;
  const std::uintptr_t first_page = segment->base + round_up(begin - segment->base, page_bytes);
  const std::uintptr_t last_page = segment->base + (end - segment->base) / page_bytes * page_bytes;
  if (last_page <= first_page) return;
  const std::size_t bytes = last_page - first_page;
  const std::uint64_t start_ns = device.now_ns();
  // Work queued on the stream may still use the pages (uses on other streams
  // kept the blocks from being free: Note [Deferred frees and streams]).
  device.synchronize_stream(segment->stream);
  const Status unmapped = device.unmap_pages(reinterpret_cast<void*>(first_page), bytes);
  note_release_wait(start_ns);
  if (unmapped != Status::ok) return;
  segment->mapped_bytes -= bytes;
  stats.reserved_bytes.decrease(static_cast<std::int64_t>(bytes));
  ++stats.num_device_free;
  trace_locked(TraceEventKind::segment_free, segment->stream, first_page, bytes);

  Block* const next = block->next;
  Block* before = block;  // the block before the pages
  if (first_page > begin) {
    block->pool->update_range(block, begin, first_page - begin);
  } else {
    block->pool->remove(block);
    before = block->prev;
  }
  Block* right = nullptr;  // what is left after the pages
  if (end > last_page) {
    right = new_block_locked();
    right->address = last_page;
    right->size = end - last_page;
    right->stream = block->stream;
    right->pool = block->pool;
    right->expandable = segment;
    right->next = next;
    if (next != nullptr) next->prev = right;
    right->pool->insert(right);
  }
  const bool block_reused = before == block;
  if (right == nullptr && next == nullptr) {
    // The segment's end: the pages leave it (a hole left at the end goes in
    // drop_trailing_holes_locked, once the caller's walk is done).
    segment->end_bytes = first_page - segment->base;
    segment->tail = before;
    if (before != nullptr) before->next = nullptr;
    if (!block_reused) recycle_block_locked(block);
    return;
  }
  Block* hole = nullptr;
  if (before != nullptr && before->state == BlockState::unmapped) {
    hole = before;  // joins the hole before it
    hole->size = last_page - hole->address;
  } else {
    hole = block_reused ? new_block_locked() : block;
    hole->address = first_page;
    hole->size = bytes;
    hole->stream = block->stream;
    hole->pool = block->pool;
    hole->expandable = segment;
    hole->prev = before;
    if (before != nullptr) before->next = hole;
    ++segment->holes;
  }
  hole->state = BlockState::unmapped;
  Block* after = right != nullptr ? right : next;
  if (right == nullptr && next->state == BlockState::unmapped) {  // joins the hole after it
    hole->size = next->address + next->size - hole->address;
    after = next->next;
    --segment->holes;
    if (segment->tail == next) segment->tail = hole;
    recycle_block_locked(next);
  }
  hole->next = after;
  if (after != nullptr) after->prev = hole;
  if (!block_reused && hole != block) recycle_block_locked(block);
  if (next == nullptr) segment->tail = right;
}

}  // namespace spillway
