// PyTorch memory snapshots as allocation traces: the dict that
// torch.cuda.memory._dump_snapshot(path) pickles after
// torch.cuda.memory._record_memory_history(), read by pickle_reader.
//
// What is used (torch/cuda/memory.py's _snapshot() describes the dict):
//   segments[i]: device, address, total_size, stream, and blocks[j]: address,
//     size, requested_size, state ("active_allocated", "active_pending_free",
//     "inactive"). The state at the time of the snapshot.
//   device_traces[device][k]: action, addr, size, stream, time_us. Actions
//     alloc, free_requested, free_completed, segment_alloc, segment_free,
//     segment_map, segment_unmap, oom, snapshot; others are skipped. Every
//     other key (frames, allocator_settings, ...) is ignored.
//
// Note [Snapshot to trace]
// An alloc entry becomes an alloc; a free_completed entry a free (the block
// is reusable from then on; a free_requested entry waits for the other
// streams that used the block). A trace without any free_completed entry
// (recorded with skip_actions=["free_completed"]) uses free_requested
// instead. The trace keeps each entry's stream and time. The history is a
// ring buffer of max_entries entries, so blocks allocated before it began
// are freed in it without an alloc, or are still live in `segments` at the
// end; both are allocated first, before the trace's events: the ones freed
// in the trace in the order of their frees, then the live ones in segment
// and block order.
//
// Note [The native figure from a snapshot]
// The recording allocator's reserved bytes are the sum of the segments'
// total_size at the end; walking the segment entries (segment_alloc and
// segment_map add their size, segment_free and segment_unmap take it away)
// back from there gives the reserved bytes when the trace began, and forward
// again the peak. Its allocated bytes count each live request rounded up as
// PyTorch rounds requests (512 B, and at least 512 B), since a trace entry
// carries the requested size only; blocks live before the trace count from
// the start. Peak reserved over peak allocated is the native figure that
// spillway's replay is compared with. It ignores roundup_power2_divisions
// and a block's unsplit remainder (PyTorch hands out up to 1 MiB more than
// asked in the large pool), which the trace does not show; both make the
// true allocated a little larger and the native figure a little smaller.
//
// Note [Cache releases in a snapshot]
// PyTorch's allocator gives segments back (segment_free, segment_unmap) only
// when the program empties its cache (torch.cuda.empty_cache()) or when a
// device malloc fails and it releases its free segments to retry. Either way
// the allocator replaying the trace is owed the same moment: the conversion
// puts one release_cache event where a run of such entries starts, and the
// replay empties spillway's cache there. Without it the replayed allocator
// kept every segment PyTorch's had returned, and was compared with an
// allocator that had started afresh.
#pragma once

#include <cstdint>
#include <string>

#include "tools/replay/allocation_trace.h"
#include "tools/replay/pickle_reader.h"

namespace spillway {

// PyTorch's rounding of a request (c10's round_size with the default
// settings): up to a multiple of 512 bytes, at least 512.
std::uint64_t pytorch_rounded_size(std::uint64_t size);

// Converts a read snapshot (Note [Snapshot to trace]). Errors are prefixed
// with `name` and say where in the dict: "x.pickle: device_traces[0][12]:
// 'size' is a string, not an integer".
AllocationTraceResult allocation_trace_from_snapshot(const PickleDocument& snapshot, int device,
                                                     const std::string& name);

}  // namespace spillway
