// ChunkStats: the chunk manager's figures, kept per client and in total.
// add_to() writes them under the contract keys of Stats (chunk_bytes.*,
// bytes_moved.*, evictions, prefetches, stall_ns, stall_ns.expected,
// stall_ns.actual and their .last_step, num_budget_overruns,
// chunk_bytes.capacity|tensors, whose ratio is chunk_fill_ratio); the counts
// of fetches and write-backs have no contract key and are reported here only.
#pragma once

#include <cstdint>

#include "allocator/config/stats.h"

namespace spillway {

struct ChunkStats {
  std::int64_t chunk_bytes_device = 0;  // device copies of resident chunks (whole slabs)
  std::int64_t chunk_bytes_host = 0;    // host payload bytes held (pinned or pageable)
  std::int64_t fetches = 0;             // host-to-device moves, prefetches included
  std::int64_t writebacks = 0;          // device-to-host moves (dirty evictions)
  std::int64_t bytes_moved_h2d = 0;
  std::int64_t bytes_moved_d2h = 0;
  std::int64_t evictions = 0;   // device copies dropped to make room, written back or not
  std::int64_t prefetches = 0;  // fetches started by prefetch()
  std::int64_t stall_ns = 0;    // time acquire blocked the host waiting for a move
  // Note [Prefetch timed by op durations] (prefetch_timing.h): the stall the
  // copy model expects from the fetches started (lateness against the use).
  std::int64_t stall_expected_ns = 0;
  // The last step's stall_ns and stall_expected_ns (end_step); kept in the
  // manager's total only (zero per client).
  std::int64_t stall_last_step_ns = 0;
  std::int64_t stall_expected_last_step_ns = 0;
  std::int64_t budget_overruns = 0;  // acquires that came in past a budget
  // The chunks as laid out (computed when asked): the capacity of every
  // chunk, wherever its bytes are, and the bytes of their tensors.
  std::int64_t capacity_bytes = 0;
  std::int64_t tensor_bytes = 0;

  // tensor_bytes over capacity_bytes (chunk_fill_ratio); 0 without chunks.
  double fill_ratio() const { return chunk_fill_ratio(tensor_bytes, capacity_bytes); }

  // Adds these figures to the chunk keys of `stats`.
  void add_to(Stats* stats) const {
    stats->chunk_bytes_device += chunk_bytes_device;
    stats->chunk_bytes_host += chunk_bytes_host;
    stats->bytes_moved_h2d += bytes_moved_h2d;
    stats->bytes_moved_d2h += bytes_moved_d2h;
    stats->evictions += evictions;
    stats->prefetches += prefetches;
    stats->stall_ns += stall_ns;
    stats->stall_ns_actual += stall_ns;
    stats->stall_ns_expected += stall_expected_ns;
    stats->stall_last_actual += stall_last_step_ns;
    stats->stall_last_expected += stall_expected_last_step_ns;
    stats->num_budget_overruns += budget_overruns;
    stats->chunk_bytes_capacity += capacity_bytes;
    stats->chunk_bytes_tensors += tensor_bytes;
  }

  friend bool operator==(const ChunkStats&, const ChunkStats&) = default;
};

}  // namespace spillway
