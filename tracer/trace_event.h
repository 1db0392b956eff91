// Trace events: what the allocator (and, later, the hooks and chunk manager)
// report to a recorder. Plain ids and sizes only, no device handles, so the
// tracer stays below the allocator in the layering (design section 1).
#pragma once

#include <cstdint>

namespace spillway {

enum class TraceEventKind : std::uint8_t {
  alloc = 1,          // a block handed to a caller
  free = 2,           // a block given back by a caller
  segment_alloc = 3,  // a slab or segment taken from the device
  segment_free = 4,   // a slab or segment returned to the device
  oom = 5,            // a request that failed; size is what was asked
};

struct TraceEvent {
  std::uint64_t time_ns = 0;  // Device::now_ns()
  TraceEventKind kind = TraceEventKind::alloc;
  std::uint64_t stream = 0;  // the stream handle as an integer (0: default stream)
  std::uint64_t address = 0;
  std::uint64_t size = 0;
};

// Where events go. Implementations must be thread-safe: the allocator calls
// record() from every thread that allocates.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void record(const TraceEvent& event) = 0;
};

}  // namespace spillway
