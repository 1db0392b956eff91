// The trace as Chrome trace-event JSON (`spillway-report --chrome out.json`),
// for chrome://tracing and ui.perfetto.dev.
//
//  - pid 1 is the traced process; tid 0 the allocator, tid client+1 a
//    chunk-manager client (ids start at 0, so +1 keeps them off the
//    allocator's row), each named by "M" metadata events.
//  - "C" counters: allocated, reserved, model and non-model bytes, one event
//    whenever a value changes.
//  - "X" complete events: stalls (Note [Stall time] in report_model.h).
//  - "i" instant events: steps (global), out-of-memories (process), chunk
//    fetch, writeback and drop (thread).
//  - ts and dur in microseconds since the trace's first event; events after
//    the metadata are sorted by ts.
#pragma once

#include <nlohmann/json.hpp>

#include "tools/report/report_model.h"
#include "tracer/trace_file.h"

namespace spillway::report {

// `trace` gives the chunk instants; `model` the counters and stalls (it must
// have been built from `trace`).
nlohmann::json chrome_trace(const TraceFileContents& trace, const ReportModel& model);

}  // namespace spillway::report
