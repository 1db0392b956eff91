// CachingAllocator: device memory for tensors, cached in slabs, under one
// budget that model data (chunks) and non-model data (activations) share.
//
// Design summary
// --------------
// Memory comes from the device in segments and is handed out in blocks carved
// from them. A freed block is cached, not returned: the next request of a
// similar size on the same stream reuses it without a device call. The pieces:
//
//  - Block (block.h): a range of a segment; a segment's blocks form an
//    address-ordered list. BlockPool (block_pool.h): the free blocks of one
//    pool, best fit per stream. BlockAddressMap (block_address_map.h): the
//    blocks handed out, by address. DeferredFrees (deferred_frees.h): blocks
//    freed but still in use on other streams. ExpandableSegment
//    (expandable_segment.h): a segment on reserved address space that grows
//    and shrinks by device pages (Note [Size classes]; Note [Expandable
//    segments], in expandable_segments.cc, with the code that maps and
//    unmaps them). CachingAllocator::Impl (caching_allocator_impl.h) holds
//    the state both files work on.
//  - One mutex guards all of it. The hot path (a cached block out and back)
//    is a rounding, two tree lookups and two hash probes under that mutex,
//    with no heap allocation (Note [A short hot path]).
//
// Note [Pools, slabs and segments]
// Requests are rounded up to 512 bytes. Requests up to 1 MiB come from the
// small pool, carved from 2 MiB slabs, so small tensors do not fragment the
// large slabs. Larger requests come from the large pool: slabs of
// large_slab_bytes (the configured chunk_size, so a chunk is exactly one
// slab), and requests bigger than that get a segment of their own, rounded
// up to 2 MiB. Oversize segments belong to the large pool too, so their
// free space can serve other large requests, as in PyTorch. That is the
// layout with expandable_segments off; with it on (the default), Note [Size
// classes] replaces the large-pool half.
//
// Note [Size classes]
// With expandable_segments, large-pool requests fall in two classes, fitted
// to how training allocates (measured on the shipped traces and a PyTorch
// model, docs/benchmarks.md):
//  - mid-size, over 1 MiB and under 10 MiB (activations, most gradients):
//    from the stream's expandable segment, grown by whole pages as needed
//    (Note [Expandable segments]); where the device has no virtual memory,
//    from 20 MiB slabs, PyTorch's rule;
//  - from 10 MiB up (attention scores, logits, big weights): a segment of
//    its own, rounded up to 2 MiB, as in PyTorch, so a freed one serves the
//    next block of its size exactly, and is returned whole.
// A request of exactly chunk_size, whatever its class, gets a segment of
// exactly that size: a chunk is still one slab, so an evicted chunk gives
// its memory back whole (in an expandable segment it could sit inside, out of
// reach of other streams, Note [Expandable segments]).
// Both classes share the large pool, so a free block of either serves any
// large request (keeping mid-size blocks out of freed large segments measured
// worse: their free space then sat idle). Putting every large request in the
// expandable segment measured worse too: long-lived large blocks in the
// middle of one address range leave holes that only smaller blocks can use.
//
// Note [Outgrown segments]
// When the shapes change (a longer sequence, a bigger batch), every large
// buffer of the new shape misses the cache, and the free segments of the
// old shape, a little too small, would stay reserved beside the new ones:
// PyTorch's allocator reserves 1.18 times its peak allocation on the
// long-context trace that way. So before a large request (10 MiB up) gets a
// new segment, the stream's free whole segments between half its size and
// its size go back to the device: they are this buffer's earlier shapes.
// Not those of half the size or less (half rounded up to 2 MiB, as that
// segment would be): there sit the buffers of another dtype or role (an
// fp16 copy of an fp32 tensor is exactly half), which the step will ask for
// again (releasing them measured worse on gpt2_medium, docs/benchmarks.md).
// It costs a device free, and on CUDA a cudaFree waits for the device, but
// only on a large miss, i.e. when shapes change.
//
// Note [Split and coalesce]
// A free block larger than the request is split; the rest stays cached as
// its own block when it is worth keeping (BlockPool::should_split: PyTorch's
// rule, >= 512 bytes in the small pool, > 1 MiB in the large pool; an
// expandable segment's free tail is kept from 512 bytes, as it grows).
// Otherwise the caller gets the whole block, and allocated_bytes counts it.
// A freed block merges with free neighbours in its segment, so a segment
// whose blocks are all free is again one block, and empty_cache can return
// it.
//
// Note [Streams own blocks]
// A block belongs to the stream it was allocated on, and is only reused on
// that stream: work queued there runs in order, so a block freed by the
// caller can be handed out again at once, even though kernels using it may
// not have run yet: the next user's kernels queue behind them. A segment's
// blocks all belong to the stream that the segment was reserved for.
//
// Note [Deferred frees and streams]
// record_stream(ptr, s) says a block is also used on stream s. Reusing it on
// its own stream as soon as the caller frees it would race with s's queued
// work. So deallocate records an event on every such stream and parks the
// block in DeferredFrees; it becomes free once all its events complete.
// Completed events are collected (query_event, never blocking) at the start
// of every allocate and deallocate; when memory runs short, and in
// empty_cache, we synchronize them instead, without holding the mutex.
// allocated_bytes drops at the caller's free; active_bytes only when the
// block is really free, so active = allocated + awaiting other streams.
//
// Note [The allocation fallback chain]
// allocate tries, in order, stopping at the first that gives a block:
//   1. a cached free block (best fit in the pool, on the stream);
//   2. a new segment within the budget;
//   3. return every fully free cached segment (all pools, all streams) to
//      the device, then a new segment (counted in num_alloc_retries);
//   4. wait for deferred frees, then 1 and 3 again;
//   5. ask each pressure handler to free memory, each followed by 1 and 3,
//      and ask it again while it frees something;
//   6. out of memory: the error says what was asked and who holds what.
// A device malloc that fails (out_of_memory, an injected fault) counts like a
// full budget and moves on down the chain. Nothing in steps 1-5 leaves the
// allocator inconsistent, so after an out-of-memory it keeps serving.
//
// Note [Asking a handler until the request fits]
// A handler frees what it was asked for (the chunk manager evicts chunks
// until their device copies add up to the request), but freed blocks help
// the request only once they make a whole segment free, which step 3 gives
// back to the device, or when they sit on the request's stream. An evicted
// chunk of an odd size shares its segment with other blocks, and a chunk's
// slab lies on the fetch stream, so the first round may free enough bytes
// and still leave the request without room: asked once, the allocator
// failed with most of the budget in chunks it could have spilled. So it asks
// the same handler again after each failed retry, until the request fits or
// the handler frees nothing (it has nothing left to give). Each round frees
// at least one block, so the loop ends.
//
// Note [Segments near the budget]
// When a whole large slab does not fit in what is left of the budget, a
// large request gets a segment just big enough (rounded to 2 MiB) instead,
// so the last few megabytes of the budget serve activations rather than
// forcing a spill.
//
// Note [Fenced slabs]
// A chunk's device copy (a request of exactly chunk_size, Note [Size
// classes]) is a slab that an eviction frees whole and a spill gives back to
// the device, so that another stream can have the memory; a small slab goes
// back the same way the other way round. Given back with cudaFree, the spill
// waits for all the device's queued work: with the copy streams busy
// (prefetches, write-backs) that is most of a copy, and it was half of a
// spilling training step on the simulated device (train_spill_wait_fraction,
// docs/benchmarks.md). So where the device has virtual memory, chunk and
// small slabs are mapped pages on an address range of their own (*mapped
// slabs*), and giving one back waits only for what may still touch it, then
// unmaps the pages and releases the range (unmapping waits for nothing by
// itself: Device::unmap_pages):
//  - the chunk manager frees a chunk's copy with deallocate_after(ptr,
//    fence stream), where its fence joined the copy's fetch, users and
//    write-back: the allocator records an event there, the slab's fence;
//  - or with deallocate_idle when all of that is done already: no wait;
//  - any other free waits for the block's own stream (uses on other streams
//    keep a block from being free: Note [Deferred frees and streams]).
// A spill's retry gives back first the slabs that need no wait, then those
// behind a fence, and only then cudaMalloc'd segments. The slab's own stream
// reuses it at once, as any block (the chunk manager orders its fetches
// after its own fences); the fence is dropped then.
//
// Note [Pressure handlers run unlocked]
// Handlers (the chunk manager) free memory by calling deallocate, and may
// hold their own locks while calling allocate. So the allocator never calls
// a handler, nor its describe_holdings, while holding its mutex: that
// would deadlock or invert lock order.
//
// Note [Time spent giving memory back]
// Returning a segment waits for the device's queued work (cudaFree and the
// simulated device's free both synchronize; unmapping pages waits for the
// segment's stream, or a mapped slab's fence: Note [Fenced slabs]), and under
// memory pressure that work is the chunk manager's write-backs of the chunks
// it just evicted. The time spent there (release_wait_ns) is a spill's cost,
// not an op's: the chunk manager takes it out of the clock its planned
// prefetches are timed by (Note [Prefetch timed by op durations]).
//
// Note [Segments past the budget]
// Reserved bytes stay within the budget, with one exception: a chunk that an
// op must have resident when nothing can be evicted (all chunks in compute)
// gets a segment past the budget (allocate_over_budget), because the op
// cannot be failed from where it is intercepted (Note [An op never runs on
// bytes that are not resident] in hooks/torch/op_hooks.cc). The overrun ends
// at the first free after it: a free while reserved exceeds the budget gives
// every fully free segment back to the device. A free deferred for its users
// (Note [Deferred frees and streams]) does so when the allocator collects it,
// at its next call after those users are done.
//
// Note [Recording under the allocator's lock]
// Trace events are recorded under the mutex, so the trace's order is the
// allocator's order: a free of an address always precedes its reuse (Note
// [Trace order] in trace_recorder.h).
//
// Note [A short hot path]
// A cached alloc+free pair must stay under 100 ns (bench_allocator measures
// it). A split cuts the new block from the front of the free block and a
// free merges into a free neighbour, and BlockPool::update_range changes
// that neighbour's range in place when its order allows, so the usual pair
// does not rebalance the tree. Blocks and set nodes are recycled, so the pair
// allocates nothing; the address map is open addressing; stats are plain
// integers under the same mutex; the clock is only read when a trace sink
// is attached. The mutex is about half of the remaining cost.
#include "allocator/caching/caching_allocator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "allocator/caching/caching_allocator_impl.h"
#include "allocator/caching/out_of_memory_report.h"
#include "allocator/config/format_bytes.h"
#include "allocator/config/invariant.h"
#include "allocator/device/event_pool.h"

namespace spillway {
namespace {

thread_local std::string t_last_error;

// Requests above this cannot be rounded without overflow; no device has it.
constexpr std::size_t kMaxRequestBytes = std::numeric_limits<std::size_t>::max() / 2;

// The mid-size class (Note [Size classes]): requests under 10 MiB, from
// 20 MiB slabs where segments are not expandable.
constexpr std::size_t kMidRequestMaxBytes = std::size_t{10} << 20;
constexpr std::size_t kMidSlabBytes = std::size_t{20} << 20;

}  // namespace

CachingAllocator::Impl::Impl(Device& device_to_use, CachingAllocatorOptions options,
                             TraceSink* trace_sink)
    : device(device_to_use),
      trace(trace_sink),
      large_slab_bytes(round_up(options.large_slab_bytes, kRoundBytes)),
      size_classes(options.expandable_segments),
      page_bytes(options.expandable_segments ? device_to_use.page_bytes() : 0),
      budget_bytes(options.budget_bytes),
      deferred_frees(device_to_use) {}

CachingAllocator::Impl::~Impl() {
  // Streams may still use blocks awaiting their events; segments go back only
  // after that work is done.
  for (Event event : deferred_frees.pending_events()) device.synchronize_event(event);
  device.synchronize();  // unmapping waits for nothing by itself
  for (const auto& [base, bytes] : segments) {
    if (mapped_slabs.contains(base)) {
      device.unmap_pages(reinterpret_cast<void*>(base), bytes);
      device.release_address_range(reinterpret_cast<void*>(base), bytes);
    } else {
      device.free(reinterpret_cast<void*>(base));
    }
  }
  for (const auto& [stream, segment] : expandable_segments) {
    // The mapped runs between holes, from the tail down.
    for (Block* block = segment->tail; block != nullptr;) {
      const std::uintptr_t run_end = block->address + block->size;
      std::uintptr_t run_start = run_end;
      for (; block != nullptr && block->state != BlockState::unmapped; block = block->prev)
        run_start = block->address;
      device.unmap_pages(reinterpret_cast<void*>(run_start), run_end - run_start);
      while (block != nullptr && block->state == BlockState::unmapped) block = block->prev;
    }
    device.release_address_range(reinterpret_cast<void*>(segment->base), segment->reserved_bytes);
  }
}

bool CachingAllocator::Impl::make_request(std::size_t bytes, Stream stream, Request* request) {
  request->asked_bytes = bytes;
  request->stream = stream;
  if (bytes > kMaxRequestBytes) return false;
  const std::size_t size = round_up(bytes, kRoundBytes);
  request->size = size;
  // Note [Pools, slabs and segments]
  if (size <= kSmallRequestMaxBytes) {
    request->pool = &small_pool;
    request->segment_bytes = request->min_segment_bytes = kSmallSlabBytes;
  } else if (!size_classes && size <= large_slab_bytes) {
    request->pool = &large_pool;
    request->segment_bytes = large_slab_bytes;
    request->min_segment_bytes = std::min(round_up(size, kOversizeRoundBytes), large_slab_bytes);
  } else if (!size_classes) {
    request->pool = &large_pool;
    request->segment_bytes = request->min_segment_bytes = round_up(size, kOversizeRoundBytes);
  } else if (size == large_slab_bytes) {  // a chunk: Note [Size classes]
    request->pool = &large_pool;
    request->segment_bytes = request->min_segment_bytes = size;
  } else if (size < kMidRequestMaxBytes) {
    request->pool = &large_pool;
    request->expandable_class = 1;
    request->segment_bytes = kMidSlabBytes;
    request->min_segment_bytes = round_up(size, kOversizeRoundBytes);
  } else {
    request->pool = &large_pool;
    request->segment_bytes = request->min_segment_bytes = round_up(size, kOversizeRoundBytes);
  }
  return true;
}

// Note [The allocation fallback chain]
Status CachingAllocator::Impl::allocate(void** ptr, std::size_t bytes, Stream stream,
                                        AllocationOwner owner) {
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;
  Request request;
  request.owner = owner;
  if (!make_request(bytes, stream, &request)) {
    return fail_out_of_memory(request, {}, "the request is too large to round");
  }
  // Reserved bytes never exceed the budget, so no amount of freeing helps.
  if (request.min_segment_bytes > budget_bytes.load(std::memory_order_relaxed)) {
    return fail_out_of_memory(
        request, {},
        fmt::format("a segment for it ({}) is larger than the whole budget, so nothing was freed",
                    format_bytes(request.min_segment_bytes)));
  }
  ReserveFailure failure;
  {
    std::lock_guard lock(mutex);
    collect_completed_frees_if_any_locked();
    // 1. A cached free block, 2. a new segment within the budget.
    Block* block = request.pool->best_fit(stream, request.size);
    if (block == nullptr) block = reserve_segment_locked(request, &failure);
    if (block != nullptr) {
      *ptr = hand_out_locked(block, request);
      return Status::ok;
    }
    // 3. Return cached free segments to the device and try again.
    ++stats.num_alloc_retries;
    if (Block* retried = retry_locked(request, &failure)) {
      *ptr = hand_out_locked(retried, request);
      return Status::ok;
    }
  }
  // 4. Wait for blocks still in use on other streams (Note [Deferred frees and streams]).
  if (wait_for_deferred_frees()) {
    std::lock_guard lock(mutex);
    if (Block* block = retry_locked(request, &failure)) {
      *ptr = hand_out_locked(block, request);
      return Status::ok;
    }
  }
  // 5. Ask the pressure handlers (Note [Pressure handlers run unlocked]),
  // each again for as long as it frees something (Note [Asking a handler
  // until the request fits]).
  for (PressureHandler* handler : pressure_handlers_snapshot()) {
    std::size_t relieved_in_all = 0;
    for (;;) {
      const std::size_t relieved = handler->relieve_pressure(request.size, stream);
      relieved_in_all += relieved;
      wait_for_deferred_frees();  // in case what it freed was in use on other streams
      std::lock_guard lock(mutex);
      if (Block* block = retry_locked(request, &failure)) {
        *ptr = hand_out_locked(block, request);
        if (relieved_in_all > 0) {
          ++stats.num_spills_for_allocation;
          trace_locked(TraceEventKind::spill_for_allocation, stream,
                       reinterpret_cast<std::uintptr_t>(*ptr), request.asked_bytes);
        }
        return Status::ok;
      }
      if (relieved == 0) break;
    }
  }
  // 6. Out of memory.
  return fail_out_of_memory(request, failure, "");
}

// Note [Segments past the budget]
Status CachingAllocator::Impl::allocate_over_budget(void** ptr, std::size_t bytes, Stream stream) {
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;
  Request request;
  request.owner = AllocationOwner::model;
  if (!make_request(bytes, stream, &request)) {
    return fail_out_of_memory(request, {}, "the request is too large to round");
  }
  request.segment_bytes = request.min_segment_bytes;  // overrun no more than needed
  ReserveFailure failure;
  std::lock_guard lock(mutex);
  collect_completed_frees_if_any_locked();
  Block* block = request.pool->best_fit(stream, request.size);
  if (block == nullptr) block = reserve_segment_locked(request, &failure, /*past_budget=*/true);
  if (block == nullptr) {
    t_last_error =
        fmt::format("a segment of {} past the budget of {}: the device refused it: {}{}",
                    format_bytes(request.min_segment_bytes),
                    format_bytes(budget_bytes.load(std::memory_order_relaxed)),
                    to_string(failure.device_status),
                    failure.device_error.empty() ? "" : fmt::format(" ({})", failure.device_error));
    return failure.device_status == Status::ok ? Status::out_of_memory : failure.device_status;
  }
  *ptr = hand_out_locked(block, request);
  return Status::ok;
}

Block* CachingAllocator::Impl::retry_locked(const Request& request, ReserveFailure* failure) {
  collect_completed_frees_locked();
  if (Block* block = request.pool->best_fit(request.stream, request.size)) return block;
  // Note [Fenced slabs]: first what goes back without a wait, then what waits
  // for its own fence, then everything (a cudaFree waits for the device).
  for (const ReleaseScope scope : {ReleaseScope::ready_slabs, ReleaseScope::mapped_slabs}) {
    if (!release_free_segments_locked(scope)) continue;
    if (Block* block = reserve_segment_locked(request, failure)) return block;
  }
  release_free_segments_locked(ReleaseScope::all);
  return reserve_segment_locked(request, failure);
}

// A new segment for the request, as one free block in the request's pool;
// null when neither the budget nor the device has room for it. A large
// request that gets no whole slab tries a segment just big enough (Note
// [Segments near the budget]), which may also fit where the device is short.
Block* CachingAllocator::Impl::reserve_segment_locked(const Request& request,
                                                      ReserveFailure* failure, bool past_budget) {
  const std::size_t budget = past_budget ? std::numeric_limits<std::size_t>::max()
                                         : budget_bytes.load(std::memory_order_relaxed);
  const std::size_t reserved = reserved_bytes_locked();
  const std::size_t left = budget > reserved ? budget - reserved : 0;
  if (page_bytes != 0 && request.expandable_class != 0) {
    if (Block* block = grow_segment_locked(request, left, failure)) return block;
    // Over budget a slab would be too; otherwise (the address range is full,
    // the device refused pages) a slab may still fit.
    if (failure->over_budget) return nullptr;
  }
  if (size_classes && request.size >= kMidRequestMaxBytes)
    release_outgrown_segments_locked(request);
  void* base = nullptr;
  std::size_t bytes = 0;
  for (const std::size_t candidate : {request.segment_bytes, request.min_segment_bytes}) {
    if (candidate == bytes) continue;  // the same size again
    bytes = candidate;
    if (bytes > left) {
      *failure =
          ReserveFailure{.over_budget = true, .device_status = Status::ok, .device_error = {}};
      continue;
    }
    // A chunk's slab or a small slab: Note [Fenced slabs].
    const bool slab = request.pool == &small_pool || request.size == large_slab_bytes;
    if (slab && size_classes) {
      base = reserve_mapped_slab_locked(bytes);
      if (base != nullptr) break;
    }
    const Status status = device.malloc(&base, bytes);
    if (status == Status::ok && base != nullptr) break;
    *failure = ReserveFailure{
        .over_budget = false, .device_status = status, .device_error = device.last_error()};
    base = nullptr;
  }
  if (base == nullptr) return nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  segments.emplace(address, bytes);
  stats.segment.increase(1);
  stats.reserved_bytes.increase(static_cast<std::int64_t>(bytes));
  ++stats.num_device_alloc;
  trace_locked(TraceEventKind::segment_alloc, request.stream, address, bytes);

  Block* block = new_block_locked();
  block->address = address;
  block->size = bytes;
  block->stream = request.stream;
  block->pool = request.pool;
  request.pool->insert(block);
  return block;
}

// Hands the request out of `free_block`, a free block in its pool. A split
// hands out a new block cut from its front, and the free block, shrunk,
// stays in the pool (Note [Split and coalesce]).
void* CachingAllocator::Impl::hand_out_locked(Block* free_block, const Request& request) {
  drop_fence_locked(free_block);  // its own stream reuses it: Note [Fenced slabs]
  Block* block = free_block;
  if (free_block->pool->should_split(*free_block, request.size)) {
    block = new_block_locked();
    block->address = free_block->address;
    block->size = request.size;
    block->stream = free_block->stream;
    block->pool = free_block->pool;
    block->expandable = free_block->expandable;
    block->prev = free_block->prev;
    block->next = free_block;
    if (block->prev != nullptr) block->prev->next = block;
    free_block->prev = block;
    free_block->pool->update_range(free_block, free_block->address + request.size,
                                   free_block->size - request.size);
  } else {
    free_block->pool->remove(free_block);
  }
  block->state = BlockState::allocated;
  block->owner = request.owner;
  block->requested_bytes = request.asked_bytes;
  allocated_blocks.insert(block);
  const auto size = static_cast<std::int64_t>(block->size);
  stats.allocation.increase(1);
  stats.allocated_bytes.increase(size);
  allocated_bytes_of(request.owner).increase(size);
  if (request.owner != AllocationOwner::model)
    non_model_high_water = std::max(non_model_high_water, stats.allocated_bytes_non_model.current);
  stats.active_bytes.increase(size);
  trace_locked(TraceEventKind::alloc, block->stream, block->address, request.asked_bytes);
  return block->pointer();
}

Status CachingAllocator::Impl::deallocate(void* ptr, std::optional<Stream> users, bool idle) {
  if (ptr == nullptr) return Status::ok;
  {
    std::lock_guard lock(mutex);
    collect_completed_frees_if_any_locked();
    if (Block* block = allocated_blocks.take(reinterpret_cast<std::uintptr_t>(ptr))) {
      // Note [Fenced slabs]: without a fence (or idle), its release waits for its stream.
      const bool mapped_slab = mapped_slabs.contains(block->address) && block->is_whole_segment();
      block->idle = idle && mapped_slab;
      if (users && mapped_slab) {
        const Event fence = fences.take();
        if (fence.handle != nullptr && device.record_event(fence, *users) == Status::ok) {
          block->fence = fence;
        } else if (fence.handle != nullptr) {
          fences.give_back(fence);
        }
      } else if (users && *users != block->stream) {
        // Any other block (a chunk larger than chunk_size, in an expandable
        // segment) is a use on `users` like record_stream's: it stays out of
        // the pool, and its pages mapped, until the work queued there is done.
        std::vector<Stream>& uses = block->used_on_streams;
        if (std::find(uses.begin(), uses.end(), *users) == uses.end()) uses.push_back(*users);
      }
      release_allocated_locked(block);
      // Note [Segments past the budget]: the overrun ends here.
      if (reserved_bytes_locked() > budget_bytes.load(std::memory_order_relaxed))
        release_free_segments_locked();
      return Status::ok;
    }
  }
  return fail_unknown_pointer("deallocate", ptr);
}

// Note [Deferred frees and streams]
void CachingAllocator::Impl::release_allocated_locked(Block* block) {
  const auto size = static_cast<std::int64_t>(block->size);
  stats.allocation.decrease(1);
  stats.allocated_bytes.decrease(size);
  allocated_bytes_of(block->owner).decrease(size);
  trace_locked(TraceEventKind::free, block->stream, block->address, block->requested_bytes);
  if (!block->used_on_streams.empty()) {
    block->state = BlockState::awaiting_streams;
    if (deferred_frees.defer(block) > 0) return;
  }
  stats.active_bytes.decrease(size);
  return_to_pool_locked(block);
}

// Makes a block free again, merged with its free neighbours. The merged
// block is a neighbour already in the pool, grown, so the pool's set rarely
// changes shape (Note [Split and coalesce]).
void CachingAllocator::Impl::return_to_pool_locked(Block* block) {
  block->state = BlockState::free;
  block->used_on_streams.clear();
  BlockPool* pool = block->pool;
  auto is_free = [](const Block* b) { return b != nullptr && b->state == BlockState::free; };
  Block* prev = is_free(block->prev) ? block->prev : nullptr;
  Block* next = is_free(block->next) ? block->next : nullptr;
  if (prev == nullptr && next == nullptr) {
    pool->insert(block);
    return;
  }
  // The run first..last becomes one block: `keeper`.
  Block* first = prev != nullptr ? prev : block;
  Block* last = next != nullptr ? next : block;
  Block* keeper = prev != nullptr ? prev : next;
  const std::uintptr_t address = first->address;
  const std::size_t size = last->address + last->size - first->address;
  if (prev != nullptr && next != nullptr) pool->remove(next);
  keeper->prev = first->prev;
  keeper->next = last->next;
  if (keeper->prev != nullptr) keeper->prev->next = keeper;
  if (keeper->next != nullptr) keeper->next->prev = keeper;
  pool->update_range(keeper, address, size);
  if (ExpandableSegment* segment = block->expandable;
      segment != nullptr && (segment->tail == block || segment->tail == next)) {
    segment->tail = keeper;
  }
  recycle_block_locked(block);
  if (prev != nullptr && next != nullptr) recycle_block_locked(next);
  SPILLWAY_INVARIANT(!is_free(keeper->prev) && !is_free(keeper->next),
                     "Note [Split and coalesce]: no two free blocks are neighbours");
}

void CachingAllocator::Impl::collect_completed_frees_locked() {
  bool collected = false;
  deferred_frees.collect_completed([this, &collected](Block* block) {
    stats.active_bytes.decrease(static_cast<std::int64_t>(block->size));
    return_to_pool_locked(block);
    collected = true;
  });
  // Note [Segments past the budget]: a deferred free ends the overrun when
  // its users are done, as a plain free does at once.
  if (collected && reserved_bytes_locked() > budget_bytes.load(std::memory_order_relaxed))
    release_free_segments_locked();
}

// Synchronizes the events of the deferred frees pending now, without the
// mutex (a stream may take long). Returns whether there were any. An event
// recycled meanwhile may have been recorded again; waiting for that later
// work is harmless.
bool CachingAllocator::Impl::wait_for_deferred_frees() {
  std::vector<Event> events;
  {
    std::lock_guard lock(mutex);
    events = deferred_frees.pending_events();
  }
  for (Event event : events) device.synchronize_event(event);
  return !events.empty();
}

bool CachingAllocator::Impl::release_free_segments_locked(ReleaseScope scope) {
  const std::size_t reserved = reserved_bytes_locked();
  for (BlockPool* pool : {&small_pool, &large_pool}) {
    for (Block* block : pool->whole_segments()) {
      const bool mapped = mapped_slabs.contains(block->address);
      const bool ready =
          mapped &&
          (block->idle || (block->fenced() && device.query_event(block->fence) == Status::ok));
      if (scope == ReleaseScope::all || (scope == ReleaseScope::mapped_slabs && mapped) || ready)
        release_segment_locked(block);
    }
  }
  if (page_bytes != 0 && scope != ReleaseScope::ready_slabs) shrink_segments_locked();
  return reserved_bytes_locked() < reserved;
}

// Note [Outgrown segments]
void CachingAllocator::Impl::release_outgrown_segments_locked(const Request& request) {
  for (Block* block : large_pool.whole_segments()) {
    if (block->stream == request.stream && block->size < request.size &&
        block->size > round_up(request.size / 2, kOversizeRoundBytes)) {
      release_segment_locked(block);
    }
  }
}

void CachingAllocator::Impl::release_segment_locked(Block* block) {
  block->pool->remove(block);
  const std::uint64_t start_ns = device.now_ns();
  if (mapped_slabs.erase(block->address) != 0) {  // Note [Fenced slabs]
    if (block->fenced()) {
      device.synchronize_event(block->fence);
    } else if (!block->idle) {
      device.synchronize_stream(block->stream);  // its stream's work; others': deferred frees
    }
    drop_fence_locked(block);
    device.unmap_pages(block->pointer(), block->size);
    device.release_address_range(block->pointer(), block->size);
  } else {
    device.free(block->pointer());
  }
  note_release_wait(start_ns);
  segments.erase(block->address);
  stats.segment.decrease(1);
  stats.reserved_bytes.decrease(static_cast<std::int64_t>(block->size));
  ++stats.num_device_free;
  trace_locked(TraceEventKind::segment_free, block->stream, block->address, block->size);
  recycle_block_locked(block);
}

// Note [Fenced slabs]
void* CachingAllocator::Impl::reserve_mapped_slab_locked(std::size_t bytes) {
  if (page_bytes == 0 || bytes % page_bytes != 0) return nullptr;
  void* base = nullptr;
  if (device.reserve_address_range(&base, bytes) != Status::ok || base == nullptr) return nullptr;
  if (device.map_pages(base, bytes) != Status::ok) {
    device.release_address_range(base, bytes);
    return nullptr;
  }
  mapped_slabs.insert(reinterpret_cast<std::uintptr_t>(base));
  return base;
}

void CachingAllocator::Impl::drop_fence_locked(Block* block) {
  block->idle = false;
  if (!block->fenced()) return;
  fences.give_back(block->fence);
  block->fence = Event{};
}

Status CachingAllocator::Impl::record_stream(void* ptr, Stream stream) {
  {
    std::lock_guard lock(mutex);
    if (Block* block = allocated_blocks.find(reinterpret_cast<std::uintptr_t>(ptr))) {
      std::vector<Stream>& uses = block->used_on_streams;
      if (stream != block->stream && std::find(uses.begin(), uses.end(), stream) == uses.end()) {
        uses.push_back(stream);
      }
      return Status::ok;
    }
  }
  return fail_unknown_pointer("record_stream", ptr);
}

void CachingAllocator::Impl::empty_cache() {
  wait_for_deferred_frees();
  std::lock_guard lock(mutex);
  collect_completed_frees_locked();
  release_free_segments_locked();
}

void CachingAllocator::Impl::set_budget_bytes(std::size_t bytes) {
  budget_bytes.store(bytes, std::memory_order_relaxed);
  std::lock_guard lock(mutex);
  if (reserved_bytes_locked() > bytes) release_free_segments_locked();
}

std::vector<PressureHandler*> CachingAllocator::Impl::pressure_handlers_snapshot() const {
  std::lock_guard lock(mutex);
  return pressure_handlers;
}

Status CachingAllocator::Impl::fail_out_of_memory(const Request& request,
                                                  const ReserveFailure& failure,
                                                  std::string reason) {
  OutOfMemoryReport report;
  report.asked_bytes = request.asked_bytes;
  report.rounded_bytes = request.size;
  report.stream = stream_id(request.stream);
  report.budget_bytes = budget_bytes.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex);
    // A model request's failure goes back to the chunk manager, which evicts
    // and tries again or reports its own failure (AllocationOwner::model).
    const bool returned_to_caller = request.owner != AllocationOwner::model;
    if (returned_to_caller) ++stats.num_ooms;
    report.reserved_bytes = reserved_bytes_locked();
    report.allocated_bytes = static_cast<std::size_t>(stats.allocated_bytes.current);
    report.awaiting_streams_bytes =
        static_cast<std::size_t>(stats.active_bytes.current - stats.allocated_bytes.current);
    report.largest_free_block_bytes =
        std::max(small_pool.largest_block_bytes(), large_pool.largest_block_bytes());
    if (returned_to_caller)
      trace_locked(TraceEventKind::oom, request.stream, 0, request.asked_bytes);
  }
  if (reason.empty() && failure.device_status != Status::ok) {
    reason = fmt::format("the device refused a new segment: {}", to_string(failure.device_status));
    if (!failure.device_error.empty()) reason += fmt::format(" ({})", failure.device_error);
  } else if (reason.empty()) {
    reason = fmt::format("a new segment of at least {} does not fit in the budget",
                         format_bytes(request.min_segment_bytes));
  }
  report.reason = std::move(reason);
  for (PressureHandler* handler : pressure_handlers_snapshot()) {
    report.pressure_handler_holdings.push_back(handler->describe_holdings());
  }
  t_last_error = report.message();
  switch (failure.device_status) {
    case Status::error:
    case Status::unavailable:
    case Status::invalid_argument:
      return failure.device_status;
    default:
      return Status::out_of_memory;
  }
}

Status CachingAllocator::Impl::fail_unknown_pointer(const char* operation, void* ptr) {
  t_last_error = fmt::format("{}: {} is not a block handed out by this allocator", operation, ptr);
  return Status::invalid_argument;
}

Block* CachingAllocator::Impl::new_block_locked() {
  if (spare_blocks.empty()) return &block_storage.emplace_back();
  Block* block = spare_blocks.back();
  spare_blocks.pop_back();
  return block;
}

void CachingAllocator::Impl::recycle_block_locked(Block* block) {
  block->prev = block->next = nullptr;
  block->expandable = nullptr;
  block->state = BlockState::free;
  block->pending_events = 0;
  block->used_on_streams.clear();
  spare_blocks.push_back(block);
}

// --- Public API ---------------------------------------------------------

CachingAllocator::CachingAllocator(Device& device, CachingAllocatorOptions options,
                                   TraceSink* trace)
    : impl_(std::make_unique<Impl>(device, options, trace)) {}

CachingAllocator::~CachingAllocator() = default;

Status CachingAllocator::allocate(void** ptr, std::size_t bytes, Stream stream,
                                  AllocationOwner owner) {
  return impl_->allocate(ptr, bytes, stream, owner);
}

Status CachingAllocator::allocate_over_budget(void** ptr, std::size_t bytes, Stream stream) {
  return impl_->allocate_over_budget(ptr, bytes, stream);
}

Status CachingAllocator::deallocate(void* ptr) { return impl_->deallocate(ptr); }

Status CachingAllocator::record_stream(void* ptr, Stream stream) {
  return impl_->record_stream(ptr, stream);
}

Status CachingAllocator::deallocate_after(void* ptr, Stream users) {
  return impl_->deallocate(ptr, users);
}

Status CachingAllocator::deallocate_idle(void* ptr) {
  return impl_->deallocate(ptr, std::nullopt, /*idle=*/true);
}

void CachingAllocator::empty_cache() { impl_->empty_cache(); }

std::uint64_t CachingAllocator::take_non_model_high_water() {
  std::lock_guard lock(impl_->mutex);
  const std::int64_t current = impl_->stats.allocated_bytes_non_model.current;
  const std::int64_t most = std::max(impl_->non_model_high_water, current);
  impl_->non_model_high_water = current;
  return static_cast<std::uint64_t>(most);
}

std::uint64_t CachingAllocator::release_wait_ns() const {
  return impl_->release_wait_ns.load(std::memory_order_relaxed);
}

void CachingAllocator::add_pressure_handler(PressureHandler* handler) {
  std::lock_guard lock(impl_->mutex);
  impl_->pressure_handlers.push_back(handler);
}

void CachingAllocator::remove_pressure_handler(PressureHandler* handler) {
  std::lock_guard lock(impl_->mutex);
  std::erase(impl_->pressure_handlers, handler);
}

std::size_t CachingAllocator::budget_bytes() const {
  return impl_->budget_bytes.load(std::memory_order_relaxed);
}

void CachingAllocator::set_budget_bytes(std::size_t bytes) { impl_->set_budget_bytes(bytes); }

Stats CachingAllocator::stats() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard lock(impl_->mutex);
  impl_->stats.reset_peaks();
}

std::string CachingAllocator::last_error() { return t_last_error; }

Device& CachingAllocator::device() const { return impl_->device; }

}  // namespace spillway
