// CachingAllocator: spillway's replacement for PyTorch's CUDA caching allocator.
//
// (Design summary: see the top of caching_allocator.cc.)
//
// Public API contract, shared by the C ABI, the runtime, the tools and, later,
// the chunk manager. The private section belongs to the implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "allocator/caching/allocation_owner.h"
#include "allocator/caching/pressure_handler.h"
#include "allocator/config/stats.h"
#include "allocator/device/device.h"
#include "tracer/trace_event.h"

namespace spillway {

struct CachingAllocatorOptions {
  // Cap on the bytes reserved from the device (slabs and segments).
  std::size_t budget_bytes = std::size_t{1} << 40;
  // Size of a large-pool slab: the configured chunk_size.
  std::size_t large_slab_bytes = 64'000'000;
  // Large-pool blocks come from one growable segment per stream on reserved
  // address space instead of slabs (Note [Expandable segments]); ignored
  // where the device has no virtual memory.
  bool expandable_segments = false;
};

class CachingAllocator {
 public:
  static constexpr std::size_t kRoundBytes = 512;
  static constexpr std::size_t kSmallRequestMaxBytes = std::size_t{1} << 20;  // 1 MiB
  static constexpr std::size_t kSmallSlabBytes = std::size_t{2} << 20;        // 2 MiB
  static constexpr std::size_t kOversizeRoundBytes = std::size_t{2} << 20;    // 2 MiB

  // `trace` may be null; when set it receives alloc/free/segment/oom events.
  CachingAllocator(Device& device, CachingAllocatorOptions options, TraceSink* trace = nullptr);
  ~CachingAllocator();  // returns every slab to the device

  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` usable on `stream`. On failure returns
  // out_of_memory (or the device's error) and *ptr = nullptr; last_error()
  // then says what was asked, reserved, allocated, cached, the largest free
  // block, and what each pressure handler holds. A zero-byte request gives a
  // null pointer and ok.
  // An allocation satisfied only after a pressure handler freed memory (the
  // chunk manager spilled chunks for it) counts in num_spills_for_allocation.
  Status allocate(void** ptr, std::size_t bytes, Stream stream,
                  AllocationOwner owner = AllocationOwner::non_model);
  // A model block where the budget has no room left: a new segment just big
  // enough, straight from the device, past the budget (Note [Budget
  // overruns]). Only for a chunk an op must have resident now; the budget is
  // back in force as soon as the block is freed. Fails only when the device
  // itself has no room.
  Status allocate_over_budget(void** ptr, std::size_t bytes, Stream stream);
  // Gives a block back. Frees of blocks used on other streams (record_stream)
  // take effect once those streams' events complete. Unknown pointers:
  // invalid_argument.
  Status deallocate(void* ptr);
  // The same, for a block whose last users are the work queued on `users` so
  // far (and what the caller ordered before it): a chunk's device copy, after
  // its write-back. Returning its memory to the device then waits for that
  // work only, not for the whole device (Note [Fenced slabs]).
  Status deallocate_after(void* ptr, Stream users);
  // The same, for a block that no queued work touches any more.
  Status deallocate_idle(void* ptr);
  // The block holding ptr is also used on `stream` (torch's record_stream).
  Status record_stream(void* ptr, Stream stream);
  // Returns every free slab to the device.
  void empty_cache();
  // Nanoseconds (device clock) spent returning memory to the device, which
  // waits for its queued work (Note [Time spent giving memory back]).
  std::uint64_t release_wait_ns() const;
  // The most non-model bytes allocated since the last call (Note [Room a
  // prefetch takes early] in allocator/policy/planned_policy.h).
  std::uint64_t take_non_model_high_water();

  // Handlers are asked in registration order; not owned.
  void add_pressure_handler(PressureHandler* handler);
  void remove_pressure_handler(PressureHandler* handler);

  std::size_t budget_bytes() const;
  void set_budget_bytes(std::size_t bytes);

  Stats stats() const;
  void reset_peak_stats();

  // Detail of this thread's last failed call; empty when none.
  static std::string last_error();

  Device& device() const;

 private:
  // Pools, the address map, deferred frees and stats; see caching_allocator.cc.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spillway
