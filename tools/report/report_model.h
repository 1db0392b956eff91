// ReportModel: what spillway-report draws and prints, computed from a trace in
// one pass over its events, in file order.
//
// Design summary:
//  - Allocator events give the caching allocator's view: allocated bytes
//    (requested sizes, +alloc -free) and reserved bytes (+segment_alloc
//    -segment_free).
//  - Chunk events (format version 2) give the chunk manager's view. A chunk's
//    device copy is itself an allocator allocation, so the allocated bytes
//    split into model bytes (capacities of the chunks resident on the device)
//    and non-model bytes (everything else: activations, workspaces), see
//    Note [Model and non-model bytes].
//  - Op events (format version 3) are counted: ops per step, chunk accesses.
//  - The model keeps every sample; the renderers downsample (sample_selection.h).
//  - Client names are not in the trace; clients are known by their ids only.
//
// Note [Model and non-model bytes]
// model = sum of capacities of (client, chunk id) pairs fetched and not yet
// dropped; non-model = max(0, allocated - model). The chunk manager allocates a
// device copy, then records its fetch, and records a drop after freeing the
// copy; the state between such a pair is not a sample of its own, so a copy
// never reads as non-model bytes. The clamp covers other orders (another
// thread's events between the two, hand-made traces).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tracer/trace_file.h"

namespace spillway::report {

// Device memory after one event.
struct MemorySample {
  std::uint64_t time_ns = 0;
  std::uint64_t allocated_bytes = 0;  // requested bytes of live allocator blocks
  std::uint64_t reserved_bytes = 0;   // bytes of live device segments
  std::uint64_t model_bytes = 0;      // capacities of device-resident chunks
  std::uint64_t non_model_bytes() const {
    return allocated_bytes > model_bytes ? allocated_bytes - model_bytes : 0;
  }
};

struct ResidencySample {
  std::uint64_t time_ns = 0;
  std::uint64_t resident_bytes = 0;
};

// What one chunk-manager client did.
struct ClientActivity {
  std::uint32_t client = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t fetches = 0;     // chunk_fetch events, prefetches included
  std::uint64_t prefetches = 0;  // chunk_fetch with the prefetch detail
  std::uint64_t writebacks = 0;
  std::uint64_t drops = 0;      // chunk_drop events, evictions included
  std::uint64_t evictions = 0;  // chunk_drop with the eviction detail
  std::uint64_t stalls = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t peak_resident_bytes = 0;
  std::uint64_t chunk_bytes = 0;           // capacities of the distinct chunks it touched
  std::vector<ResidencySample> residency;  // starts at 0 at the trace's first event
};

// One host wait for chunk moves.
//
// Note [Stall time]
// A stall event is recorded when the wait ends, so the wait covers
// [time_ns - duration_ns, time_ns].
struct Stall {
  std::uint64_t time_ns = 0;  // when the wait ended
  std::uint64_t duration_ns = 0;
  std::uint32_t client = 0;
  std::uint64_t chunk_id = 0;
};

struct StepMark {
  std::uint64_t time_ns = 0;
  std::uint64_t step = 0;      // the step just finished
  std::uint64_t ops = 0;       // op_begin events since the previous step mark (version 3)
  std::uint64_t stall_ns = 0;  // stall events since the previous step mark
  // The stall the copy model expected in the step (the step event's size;
  // Note [Prefetch timed by op durations]); 0 in traces that predate it.
  std::uint64_t expected_stall_ns = 0;
};

struct OutOfMemory {
  std::uint64_t time_ns = 0;
  std::uint64_t requested_bytes = 0;
};

// One chunk copy, for the traffic chart.
struct Transfer {
  std::uint64_t time_ns = 0;
  std::uint64_t bytes = 0;
  bool to_device = true;  // fetch (host to device) or writeback (device to host)
};

struct ReportTotals {
  std::uint64_t event_count = 0;
  std::uint64_t duration_ns = 0;  // last event's time minus the first's
  std::uint64_t peak_allocated_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  std::uint64_t peak_model_bytes = 0;
  std::uint64_t peak_non_model_bytes = 0;
  std::uint64_t model_size_bytes = 0;  // capacities of all distinct chunks seen
  // Note [Chunk fill from the trace]: the chunks fetched, their device copies'
  // bytes and the bytes their tensors span (a fetch copies the used bytes).
  std::uint64_t fetched_chunk_capacity_bytes = 0;
  std::uint64_t fetched_chunk_used_bytes = 0;
  // used over capacity: the chunks' fill on the device (0 when no chunk was
  // fetched).
  double chunk_fill_ratio() const;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t fetches = 0;
  std::uint64_t prefetches = 0;
  std::uint64_t writebacks = 0;
  std::uint64_t drops = 0;
  std::uint64_t evictions = 0;
  std::uint64_t stalls = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t ooms = 0;
  std::uint64_t largest_oom_request_bytes = 0;
  // Allocations that fit only after chunks were evicted for them (version 4).
  std::uint64_t spills_for_allocation = 0;
  // Chunks made resident past the budget for an op (version 4).
  std::uint64_t budget_overruns = 0;
  std::uint64_t largest_overrun_bytes = 0;
  // The largest set of chunks one op needed at once (version 4; 0: not recorded).
  std::uint64_t min_budget_bytes = 0;
  std::uint64_t steps = 0;
  std::uint64_t ops = 0;  // op_begin events (version 3)
  std::uint64_t ops_after_steps = 0;
  std::uint64_t stall_ns_after_steps =
      0;  // stall time after the last step mark  // ... after the last step mark
  std::uint64_t chunk_accesses = 0;  // chunk_access events (version 3)
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t segment_allocs = 0;
  // Frees and segment frees with nothing live to subtract from (a trace that
  // started mid-run); counted rather than letting the totals wrap.
  std::uint64_t unmatched_frees = 0;
};

struct ReportModel {
  std::uint32_t format_version = 0;
  TraceMetadata metadata;
  std::optional<std::uint64_t> device_budget_bytes;  // metadata device_budget_bytes
  std::optional<std::uint64_t> chunk_size_bytes;     // metadata chunk_size_bytes
  std::uint64_t first_time_ns = 0;
  std::uint64_t last_time_ns = 0;
  bool has_chunk_events = false;  // any chunk_fetch/writeback/drop or stall
  std::size_t op_name_count = 0;  // distinct op names defined (version 3)

  std::vector<MemorySample> memory;     // a sample at the first event, then one per change
  std::vector<ClientActivity> clients;  // by client id
  std::vector<Stall> stalls;
  std::vector<StepMark> steps;
  std::vector<OutOfMemory> ooms;
  std::vector<Transfer> transfers;
  ReportTotals totals;
};

ReportModel build_report_model(const TraceFileContents& trace);

// Bytes copied in each of `bucket_count` equal time spans covering the trace.
struct TrafficBucket {
  std::uint64_t start_ns = 0;  // relative to the first event
  std::uint64_t end_ns = 0;
  std::uint64_t bytes_h2d = 0;
  std::uint64_t bytes_d2h = 0;
  std::uint64_t stall_ns = 0;  // stall time ending in this span
};
std::vector<TrafficBucket> traffic_buckets(const ReportModel& model, std::size_t bucket_count);

}  // namespace spillway::report
