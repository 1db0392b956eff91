// OpEventCheck: see op_event_check.h.
#include "tracer/op_event_check.h"

#include "tracer/trace_record_layout.h"

namespace spillway {

std::optional<TraceRecordProblem> OpEventCheck::check(
    const TraceEvent& event, const std::map<std::uint32_t, std::string>& names) {
  const bool is_begin = event.kind == TraceEventKind::op_begin;
  const char* kind = is_begin ? "op_begin" : "op_end";
  const std::string op = std::string(kind) + " of op " + std::to_string(event.address);
  if (event.detail != 0)
    return TraceRecordProblem{kRecordDetailOffset, op + ": detail is not zero"};
  if (!names.contains(event.client))
    return TraceRecordProblem{kRecordClientOffset,
                              op + " uses op name id " + std::to_string(event.client) +
                                  ", which no op_name record before it defines"};
  if (event.address == 0)
    return TraceRecordProblem{kRecordAddressOffset,
                              std::string(kind) + ": sequence number 0 (they start at 1)"};
  if (is_begin) {
    if (!open_.emplace(event.address, OpenOp{event.client, event.stream, event.time_ns}).second)
      return TraceRecordProblem{kRecordAddressOffset, op + ": that op is already open"};
    return std::nullopt;
  }
  const auto found = open_.find(event.address);
  if (found == open_.end())
    return TraceRecordProblem{kRecordAddressOffset, op + ", which no open op_begin starts"};
  const OpenOp begun = found->second;
  if (begun.name_id != event.client)
    return TraceRecordProblem{kRecordClientOffset,
                              op + ": op name id " + std::to_string(event.client) +
                                  " differs from its op_begin's " + std::to_string(begun.name_id)};
  if (begun.thread != event.stream)
    return TraceRecordProblem{kRecordStreamOffset, op + ": thread " + std::to_string(event.stream) +
                                                       " differs from its op_begin's " +
                                                       std::to_string(begun.thread)};
  if (event.time_ns < begun.begin_ns || event.size != event.time_ns - begun.begin_ns)
    return TraceRecordProblem{kRecordSizeFieldOffset,
                              op + ": duration " + std::to_string(event.size) +
                                  " ns is not its end time minus its begin time"};
  open_.erase(found);
  return std::nullopt;
}

}  // namespace spillway
