// dump_trace: a complete trace file of what the `trace` option recorded so
// far, while the live file stays open for later events.
//
// The live file has no end record until the process exits (runtime.h), so
// readers reject it mid-run. A snapshot re-encodes the records written up to
// a flush, with an end record, into a file of its own; writing that to the
// live path would replace the file the recorder is still appending to, hence
// the refusal. Events another thread records during the dump may or may not
// be in it (call it between steps).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator/runtime.h"
#include "hooks/torch/spillway_torch.h"
#include "tracer/trace_file.h"

namespace spillway {

namespace {

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::weakly_canonical(a, error) == std::filesystem::weakly_canonical(b, error);
}

// The live file's bytes up to a record boundary: only as many as were there
// right after the flush (the writer may append more meanwhile).
std::string read_prefix(const std::string& path, std::uintmax_t size) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw std::runtime_error("spillway::dump_trace: cannot read the live trace " + path);
  return bytes;
}

}  // namespace

void dump_trace(const std::string& path) {
  Runtime& runtime = Runtime::process();
  TraceRecorder* recorder =
      runtime.active_allocator() != nullptr ? runtime.trace_recorder() : nullptr;
  if (recorder == nullptr)
    throw std::runtime_error(
        "spillway::dump_trace: tracing is off; set the trace key (e.g. "
        "SPILLWAY_CONF=...,trace:/tmp/run.trace) before spillway activates");
  const std::string live = recorder->path();
  if (same_file(path, live))
    throw std::invalid_argument("spillway::dump_trace: " + path +
                                " is the live trace file; dump to another path (the live file is "
                                "completed at exit)");
  std::string error;
  if (!runtime.flush_trace(&error)) throw std::runtime_error("spillway::dump_trace: " + error);
  std::error_code size_error;
  const std::uintmax_t size = std::filesystem::file_size(live, size_error);
  if (size_error)
    throw std::runtime_error("spillway::dump_trace: " + live + ": " + size_error.message());
  TraceReadOptions options;
  options.allow_missing_end = true;
  TraceReadResult read = parse_trace(read_prefix(live, size), options);
  if (!read.ok()) throw std::runtime_error("spillway::dump_trace: " + live + ": " + read.error);
  // The prefix may stop inside an op name's definition (the writer was
  // appending): its pieces would make the snapshot incoherent, so they go.
  std::vector<TraceEvent> events = std::move(read.trace->events);
  while (!events.empty() && events.back().kind == TraceEventKind::op_name &&
         !read.trace->op_names.contains(events.back().client)) {
    events.pop_back();
  }
  const std::string bytes = encode_trace(read.trace->metadata, events, runtime.device().now_ns());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("spillway::dump_trace: cannot write " + path);
}

}  // namespace spillway
