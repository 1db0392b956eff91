// AllocationTrace: the alloc/free sequence spillway-replay replays, loaded
// from a binary trace file (docs/trace-format.md), a PyTorch memory snapshot
// (memory_snapshot.h) or a CSV file.
//
// CSV form, one event per line:
//
//   action,ptr,size,stream,time_ns
//   alloc,0x7f3a00000000,3145728,0,1000
//   free,0x7f3a00000000,3145728,0,2000
//
// `action` is alloc, free or empty_cache (the program returned the cache's
// free memory to the device, as torch.cuda.empty_cache() does; its ptr and
// size are ignored); `ptr` a hex (0x...) or decimal id that pairs a free with
// its alloc; `size` bytes (may be empty for free); `stream` and
// `time_ns` optional (default 0). The header line is optional; when present
// its column names may come in any order. Blank lines and lines starting
// with '#' are skipped. Every error names the line (CSV) or byte offset
// (binary).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tracer/trace_file.h"

namespace spillway {

struct AllocationEvent {
  // release_cache: the program emptied the allocator's cache here (Note
  // [Cache releases in a snapshot] in memory_snapshot.h).
  enum class Kind : std::uint8_t { alloc, free, release_cache };
  Kind kind = Kind::alloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t time_ns = 0;
  // Where it came from: the CSV line number, or the binary record's offset.
  std::uint64_t location = 0;
};

struct AllocationTrace {
  enum class Format { binary, csv, snapshot };
  Format format = Format::csv;
  std::vector<AllocationEvent> events;
  TraceMetadata metadata;  // binary traces only
  // From a binary trace's or a snapshot's segment and oom events: what the
  // recording allocator reserved at its peak and how often it ran out.
  std::uint64_t recorded_peak_reserved_bytes = 0;
  std::uint64_t recorded_ooms = 0;
  // Snapshots only: the recording allocator's peak allocated bytes (requests
  // rounded as PyTorch rounds them, Note [The native figure from a
  // snapshot]), the device read, its number of trace entries, and how many
  // blocks were live before the trace began (the first events).
  std::uint64_t recorded_peak_allocated_bytes = 0;
  int snapshot_device = 0;
  std::uint64_t snapshot_entries = 0;
  std::uint64_t blocks_live_before_trace = 0;

  // "line 12", "byte offset 4096", or for a snapshot "device_traces[0][7]"
  // (a trace entry) or "live block 3 of the snapshot's segments", for
  // messages about one event.
  std::string where(const AllocationEvent& event) const;
  // The recording allocator's peak reserved / peak allocated; 0 when not known.
  double recorded_fragmentation() const;
};

struct AllocationTraceResult {
  AllocationTrace trace;
  std::string error;  // non-empty on failure: "<path>:<line>: ..." or "<path>: byte offset N: ..."
  bool ok() const { return error.empty(); }
};

struct TraceLoadOptions {
  int snapshot_device = 0;  // which device of a PyTorch memory snapshot
};

// Reads `path`, choosing the format by content (a binary trace starts with
// "SPWTRACE", a snapshot with pickle's PROTO opcode 0x80; anything else is
// read as CSV).
AllocationTraceResult load_allocation_trace(const std::string& path,
                                            const TraceLoadOptions& options = {});

// Parses CSV text; errors are prefixed with `name`.
AllocationTraceResult parse_allocation_csv(std::string_view text, const std::string& name);

// Takes the alloc/free events of a decoded binary trace.
AllocationTrace allocation_trace_from(const TraceFileContents& contents);

}  // namespace spillway
