// The step a trace file recorded, as the cost simulator's StepTrace
// (tracer/planner/step_trace.h), so a measured run can be set beside the
// simulator's bound for the same step.
//
// Each top-level op (op_begin with no enclosing op) is a moment. Its duration
// runs to the next top-level op's begin (the last one's to the step event),
// so work between hooked ops (activation-only ops) counts as compute, less
// the host's stalls and spills inside it (the simulator adds its own: Note
// [Spills are not compute] in traced_step.cc). Its chunks are
// the chunk_access records until the next moment, a chunk's first access
// after a zero fill (a chunk_fetch of size 0) fresh (ChunkUse::fresh); its
// non-model bytes are the peak of live allocator bytes less resident chunk
// capacity meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "tracer/planner/step_trace.h"
#include "tracer/trace_file.h"

namespace spillway::bench {

struct TracedStep {
  plan::StepTrace step;
  std::uint64_t chunk_size = 0;  // the largest chunk capacity seen
  std::uint64_t wall_ns = 0;     // from the previous step event (or the first op) to its own
  std::string error;             // empty when the step was found
};

// The step that ended with step event number `step` (from 1); it needs the
// event of step - 1 too (or the trace's start for step 1).
TracedStep traced_step(const TraceFileContents& trace, std::uint64_t step);

}  // namespace spillway::bench
