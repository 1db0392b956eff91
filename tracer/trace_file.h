// Trace file, format version 4: the binary file behind the `trace` option,
// read by spillway-replay and spillway-report. Layout in docs/trace-format.md.
//
// Design summary:
//  - Little-endian, written byte by byte, so files move between machines.
//  - A header: magic "SPWTRACE", format version, header size, record size,
//    creation metadata as key/value strings (device, budget, config, ...), and
//    a CRC-32 over the whole header. Magic and version sit at fixed offsets in
//    every version, so a reader rejects a newer file by its version number
//    before trusting anything else.
//  - Then fixed-size 40-byte event records, and last an end record carrying the
//    event count and a CRC-32 of all event records. A file without its end
//    record is truncated (the writer did not finish); readers say so rather
//    than returning a silently short trace (see TraceReadOptions).
//  - Reading never throws and never trusts a length before checking it: every
//    rejection is an error string that names the byte offset.
//  - Version 2 added chunk moves, stalls and step boundaries (new kinds, and
//    the record's two reserved fields became `detail` and `client`).
//    Version 3 added op begin/end, chunk access/release and op-name records
//    (Note [Op events] in op_tracer.h; op_name_records.h). Version 4 added
//    spill_for_allocation, budget_overrun and min_budget. The writer writes version 4;
//    the reader reads 1 to 4, checking each record's kind against
//    its file's version and version 3's records for coherence (names defined
//    before use, ops closed by their own op_end), and rejects newer versions
//    by number.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tracer/trace_event.h"

namespace spillway {

inline constexpr char kTraceMagic[8] = {'S', 'P', 'W', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t kTraceFormatVersion = 4;        // what the writer writes
inline constexpr std::uint32_t kOldestTraceFormatVersion = 1;  // the oldest the reader reads
inline constexpr std::size_t kTraceFixedHeaderBytes = 40;
inline constexpr std::size_t kTraceRecordBytes = 40;
// Kind of the record that closes a finished file (not a TraceEventKind).
inline constexpr std::uint16_t kTraceEndRecordKind = 0xFFFF;

// Creation info, in the order written: ("device", "sim (4.00 GiB)"), ...
using TraceMetadata = std::vector<std::pair<std::string, std::string>>;

// The value for `key`, if present.
std::optional<std::string> find_metadata(const TraceMetadata& metadata, std::string_view key);

// Appends events to a new trace file. Not thread-safe: TraceRecorder
// serializes calls. Errors are sticky; the first one is kept in error().
class TraceFileWriter {
 public:
  // Creates (truncates) `path` and writes the header. Null with *error set on
  // failure.
  static std::unique_ptr<TraceFileWriter> create(const std::string& path,
                                                 const TraceMetadata& metadata, std::string* error);
  ~TraceFileWriter();  // finish()es if not done

  TraceFileWriter(const TraceFileWriter&) = delete;
  TraceFileWriter& operator=(const TraceFileWriter&) = delete;

  bool write(std::span<const TraceEvent> events);
  // Pushes buffered bytes to the operating system.
  bool flush();
  // Writes the end record and closes the file. Later writes fail.
  bool finish(std::uint64_t end_time_ns = 0);

  std::uint64_t events_written() const { return events_written_; }
  const std::string& path() const { return path_; }
  const std::string& error() const { return error_; }

 private:
  TraceFileWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  bool write_bytes(const void* data, std::size_t size);

  std::string path_;
  std::FILE* file_;
  std::uint64_t events_written_ = 0;
  std::uint32_t records_crc_ = 0;  // running CRC-32 of the event records written
  std::string error_;
};

// The bytes of a whole finished trace, for tests and tools that build traces
// in memory.
std::string encode_trace(const TraceMetadata& metadata, std::span<const TraceEvent> events,
                         std::uint64_t end_time_ns = 0);

struct TraceReadOptions {
  // Accept a file that ends, at a record boundary, without its end record (a
  // process that crashed before closing its trace), returning the complete
  // records. Truncation inside a record and every other error still fail.
  bool allow_missing_end = false;
};

struct TraceFileContents {
  std::uint32_t format_version = 0;
  TraceMetadata metadata;
  // Every record but the end record, op_name pieces included.
  std::vector<TraceEvent> events;
  // Version 3: op-name id -> name, from the op_name records; op_begin and
  // op_end carry the id in TraceEvent::client.
  std::map<std::uint32_t, std::string> op_names;
  bool finished = false;  // the end record was present and checked
  std::uint64_t end_time_ns = 0;
  std::uint64_t first_record_offset = 0;  // events[i] is at first_record_offset + 40 * i
};

struct TraceReadResult {
  std::optional<TraceFileContents> trace;
  std::string error;  // "byte offset N: ..." when trace is empty
  bool ok() const { return trace.has_value(); }
};

// Validates and decodes a whole trace held in memory.
TraceReadResult parse_trace(std::string_view bytes, TraceReadOptions options = {});
// Reads and parses a file; errors start with the path.
TraceReadResult read_trace_file(const std::string& path, TraceReadOptions options = {});

// True when `bytes` starts like a trace file (the magic), whatever its version.
bool looks_like_trace_file(std::string_view bytes);

}  // namespace spillway
