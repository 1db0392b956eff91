// Op names in a trace (format version 3): an op name is longer than a record,
// so it is defined once, before its first use, by a run of consecutive
// op_name records, and op events carry its id. Layout in
// docs/trace-format.md ("Op names").
//
// Design summary:
//  - Piece 0 (detail 0) opens the definition: client = the id, stream = the
//    name's length in bytes, address and size zero.
//  - Pieces 1..n (detail = the piece index) carry the name's bytes, 24 per
//    record, in the record's last 24 bytes (the stream, address and size
//    fields, read as little-endian integers); the last piece is zero-padded.
//    An empty name is piece 0 alone.
//  - OpNameAssembler checks a file's op_name runs as the reader meets them:
//    every piece in order, nothing in between, no id defined twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tracer/trace_event.h"

namespace spillway {

inline constexpr std::size_t kOpNameBytesPerRecord = 24;
// Longer names are cut to this many bytes by the writer (op names are short:
// "aten::addmm"); readers reject a longer declared length.
inline constexpr std::size_t kMaxOpNameBytes = 4096;

// The records that define `id` as `name` (cut to kMaxOpNameBytes), all at
// `time_ns`, for TraceSink::record_together.
std::vector<TraceEvent> op_name_records(std::uint32_t id, std::string_view name,
                                        std::uint64_t time_ns);

// A problem found in a record: the offset of the offending field inside the
// record, and what is wrong.
struct TraceRecordProblem {
  std::size_t field_offset = 0;
  std::string what;
};

// Follows the op_name records of one file, in file order.
class OpNameAssembler {
 public:
  // Every record of the file goes through here. An op_name record extends
  // the definition in progress or opens one; any other record while one is
  // in progress is a problem.
  std::optional<TraceRecordProblem> add(const TraceEvent& event);
  // True while a definition misses pieces (the file must not end there).
  bool in_progress() const { return pending_.has_value(); }
  const std::map<std::uint32_t, std::string>& names() const { return names_; }

 private:
  struct Pending {
    std::uint32_t id = 0;
    std::size_t length = 0;
    std::uint16_t next_piece = 1;
    std::string bytes;
  };
  std::optional<TraceRecordProblem> open(const TraceEvent& event);
  std::optional<TraceRecordProblem> extend(const TraceEvent& event);
  void complete_if_done();

  std::optional<Pending> pending_;
  std::map<std::uint32_t, std::string> names_;
};

}  // namespace spillway
