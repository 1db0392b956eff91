// Trace events: what the allocator, the chunk manager and the hooks report to
// a recorder. Plain ids and sizes only, no device handles, so the
// tracer stays below the allocator in the layering (design section 1).
#pragma once

#include <cstdint>
#include <span>

namespace spillway {

enum class TraceEventKind : std::uint8_t {
  alloc = 1,          // a block handed to a caller
  free = 2,           // a block given back by a caller
  segment_alloc = 3,  // a slab or segment taken from the device
  segment_free = 4,   // a slab or segment returned to the device
  oom = 5,            // a request that failed; size is what was asked
  // Format version 2 (docs/trace-format.md): chunk moves and step boundaries.
  // For these, `address` is the chunk id (or the step number) and `stream`
  // holds the chunk's capacity; see the field comments below.
  chunk_fetch = 6,      // host-to-device copy queued; size: bytes copied
  chunk_writeback = 7,  // device-to-host copy queued; size: bytes copied
  chunk_drop = 8,       // device copy given back; size: its capacity
  stall = 9,            // the host waited for chunk moves; size: nanoseconds
  step = 10,            // iteration boundary; address: the step just finished
  // Format version 3: ops and chunk uses. Note [Op events] in op_tracer.h;
  // the exact fields are in docs/trace-format.md.
  op_name = 11,        // one piece of an op name's definition (op_name_records.h)
  op_begin = 12,       // an op that touches managed tensors starts
  op_end = 13,         // ... and ends; size: its duration in nanoseconds
  chunk_access = 14,   // a tensor of the chunk acquired on the device; size: the TensorId
  chunk_release = 15,  // ... and released; size: the TensorId
  // Format version 4: pressure that spilling resolved, and budget overruns.
  // An allocator event: an allocation satisfied only after the chunk manager
  // evicted chunks for it; address: the block, size: the bytes asked.
  spill_for_allocation = 16,
  // A chunk event: a chunk made resident past the budget because an op must
  // have it and nothing could be evicted; size: the bytes over the budget.
  budget_overrun = 17,
  // min_budget_bytes grew (Note [The smallest budget] in chunk_reports.cc):
  // size: the new value; the other fields zero.
  min_budget = 18,
};

// TraceEvent::detail of chunk_fetch and chunk_drop.
inline constexpr std::uint16_t kTraceDetailPrefetch = 1;  // chunk_fetch: started by prefetch()
inline constexpr std::uint16_t kTraceDetailEviction = 1;  // chunk_drop: evicted for room
// TraceEvent::detail of chunk_access: the AccessMode (never 0).
inline constexpr std::uint16_t kTraceDetailRead = 1;
inline constexpr std::uint16_t kTraceDetailReadWrite = 2;

// The largest kind each format version knows.
inline constexpr TraceEventKind kLastTraceEventKindV1 = TraceEventKind::oom;
inline constexpr TraceEventKind kLastTraceEventKindV2 = TraceEventKind::step;
inline constexpr TraceEventKind kLastTraceEventKindV3 = TraceEventKind::chunk_release;
inline constexpr TraceEventKind kLastTraceEventKind = TraceEventKind::min_budget;

struct TraceEvent {
  std::uint64_t time_ns = 0;  // Device::now_ns()
  TraceEventKind kind = TraceEventKind::alloc;
  // Allocator events: the stream handle as an integer (0: default stream).
  // Chunk events: the chunk's capacity in bytes. Op events: the thread.
  std::uint64_t stream = 0;
  std::uint64_t address = 0;  // block or segment; chunk id; step number; op sequence number
  std::uint64_t size = 0;
  // Last, so that {time, kind, stream, address, size} still initializes the
  // allocator's events.
  std::uint16_t detail = 0;  // chunk events: kTraceDetail*; op_name: the piece; zero otherwise
  // Chunk and stall events: the ClientId; op events: the op-name id; zero otherwise.
  std::uint32_t client = 0;
};

// Where events go. Implementations must be thread-safe: the allocator calls
// record() from every thread that allocates.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void record(const TraceEvent& event) = 0;
  // Records the events in order with no other thread's event between them
  // (an op name's pieces must be consecutive in the file).
  virtual void record_together(std::span<const TraceEvent> events) = 0;
};

}  // namespace spillway
