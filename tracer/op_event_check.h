// OpEventCheck: the reader's coherence checks of op_begin and op_end records
// (format version 3; Note [Op events] in op_tracer.h).
//
// An op event must use an op-name id defined before it; an op_begin must not
// reuse the sequence number of an op still open; an op_end must close an
// open op_begin with the same sequence number, name and thread, and carry
// its duration (end time - begin time). Ops still open at the end of a file
// are fine: the process ended, or the trace was closed, inside them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "tracer/op_name_records.h"
#include "tracer/trace_event.h"

namespace spillway {

class OpEventCheck {
 public:
  // `event` is an op_begin or op_end; `names` the op names defined so far.
  std::optional<TraceRecordProblem> check(const TraceEvent& event,
                                          const std::map<std::uint32_t, std::string>& names);

 private:
  struct OpenOp {
    std::uint32_t name_id;
    std::uint64_t thread;
    std::uint64_t begin_ns;
  };
  std::unordered_map<std::uint64_t, OpenOp> open_;  // by sequence number
};

}  // namespace spillway
