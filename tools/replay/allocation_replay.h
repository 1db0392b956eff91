// Allocation replay: runs an AllocationTrace through a CachingAllocator on a
// SimDevice and reports what the allocator reserved against what was live.
//
// The figure that matters is fragmentation = peak reserved / peak allocated
// (PyTorch's reserved_bytes and allocated_bytes): how much device memory the
// caching allocator needs beyond the blocks it hands out. Event times are
// ignored; order is all that counts. The simulated device's memory is never
// touched (no poisoning), so replaying a trace of many gigabytes costs address
// space, not RAM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "allocator/config/stats.h"
#include "tools/replay/allocation_trace.h"

namespace spillway {

struct ReplayOptions {
  // Device budget; 0: unlimited (the simulated device is made large enough).
  std::size_t budget_bytes = 0;
  // Large-pool slab size, as the chunk_size option sets it.
  std::size_t chunk_size = 64'000'000;
  // The expandable_segments option (Note [Expandable segments]); its
  // default is the option's.
  bool expandable_segments = true;
};

struct ReplayResult {
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t failed_allocs = 0;    // out of memory in the replay
  std::uint64_t unmatched_frees = 0;  // frees of addresses the trace never allocated
  std::uint64_t cache_releases = 0;   // release_cache events: empty_cache() calls
  // Peak of the live requested bytes, before the allocator's rounding.
  std::uint64_t peak_requested_bytes = 0;
  Stats stats;  // the allocator's, at the end of the replay (peaks included)
  // Where reserved memory first reached its peak: the event (its location,
  // see AllocationTrace::where), its size, and the bytes allocated just then.
  // Tells what the caching costs and where (a diagnostic for fragmentation).
  std::uint64_t peak_reserved_location = 0;
  std::uint64_t peak_reserved_request_bytes = 0;
  std::int64_t allocated_at_peak_reserved = 0;

  std::int64_t peak_allocated_bytes() const { return stats.allocated_bytes.peak; }
  std::int64_t peak_reserved_bytes() const { return stats.reserved_bytes.peak; }
  // peak reserved / peak allocated; 0 when nothing was allocated.
  double fragmentation() const;
};

// False with *error ("line 12: ...") when the trace is inconsistent: an
// address allocated twice without a free between.
bool replay_allocations(const AllocationTrace& trace, const ReplayOptions& options,
                        ReplayResult* result, std::string* error);

}  // namespace spillway
