// AllocationTrace loading: binary trace files through tracer/trace_file,
// PyTorch memory snapshots through memory_snapshot, CSV parsed here, all with
// errors that point at the line, byte or trace entry.
#include "tools/replay/allocation_trace.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "tools/replay/memory_snapshot.h"
#include "tools/replay/pickle_reader.h"

namespace spillway {

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// Decimal, or hex with a 0x prefix when `allow_hex`.
std::optional<std::uint64_t> parse_u64(std::string_view text, bool allow_hex) {
  int base = 10;
  if (allow_hex && text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  if (text.empty()) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    fields.push_back(trim(line.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

enum Column { kAction, kPtr, kSize, kStream, kTime, kColumnCount };
constexpr std::array<std::string_view, kColumnCount> kColumnNames = {"action", "ptr", "size",
                                                                     "stream", "time_ns"};

}  // namespace

std::string AllocationTrace::where(const AllocationEvent& event) const {
  switch (format) {
    case Format::csv:
      return "line " + std::to_string(event.location);
    case Format::binary:
      return "byte offset " + std::to_string(event.location);
    case Format::snapshot:
      if (event.location < snapshot_entries)
        return "device_traces[" + std::to_string(snapshot_device) + "][" +
               std::to_string(event.location) + "]";
      return "live block " + std::to_string(event.location - snapshot_entries) +
             " of the snapshot's segments";
  }
  return {};
}

double AllocationTrace::recorded_fragmentation() const {
  if (recorded_peak_allocated_bytes == 0) return 0;
  return static_cast<double>(recorded_peak_reserved_bytes) /
         static_cast<double>(recorded_peak_allocated_bytes);
}

AllocationTraceResult parse_allocation_csv(std::string_view text, const std::string& name) {
  AllocationTraceResult result;
  result.trace.format = AllocationTrace::Format::csv;
  // Column positions; the default order unless a header says otherwise.
  std::array<int, kColumnCount> position = {0, 1, 2, 3, 4};
  bool seen_data_or_header = false;
  std::uint64_t line_number = 0;
  // A UTF-8 byte order mark (spreadsheets write one) is not part of the header.
  std::size_t start = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  auto fail = [&](const std::string& what) {
    result.error = name + ":" + std::to_string(line_number) + ": " + what;
    return result;
  };
  while (start < text.size()) {
    // A line ends at LF, CRLF or a lone CR (old Mac files).
    std::size_t end = text.find_first_of("\r\n", start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = trim(text.substr(start, end - start));
    start = end + 1;
    if (end < text.size() && text[end] == '\r' && start < text.size() && text[start] == '\n')
      ++start;  // CRLF is one line end
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    const std::vector<std::string_view> fields = split_fields(line);

    // The header, when there is one, is the first line and names an action column.
    const bool is_header = !seen_data_or_header &&
                           std::any_of(fields.begin(), fields.end(),
                                       [](std::string_view f) { return lower(f) == "action"; });
    if (is_header) {
      position.fill(-1);
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const std::string column = lower(fields[i]);
        for (int c = 0; c < kColumnCount; ++c) {
          if (column != kColumnNames[c]) continue;
          if (position[c] != -1) return fail("column '" + column + "' appears twice in the header");
          position[c] = static_cast<int>(i);
        }
      }
      for (int c : {kAction, kPtr, kSize})
        if (position[c] == -1)
          return fail("the header has no '" + std::string(kColumnNames[c]) +
                      "' column (expected action,ptr,size,stream,time_ns)");
      seen_data_or_header = true;
      continue;
    }
    seen_data_or_header = true;

    auto field = [&](Column c) -> std::string_view {
      const int at = position[c];
      return at >= 0 && static_cast<std::size_t>(at) < fields.size() ? fields[at]
                                                                     : std::string_view();
    };
    AllocationEvent event;
    event.location = line_number;
    const std::string action = lower(field(kAction));
    if (action == "alloc") {
      event.kind = AllocationEvent::Kind::alloc;
    } else if (action == "free") {
      event.kind = AllocationEvent::Kind::free;
    } else if (action == "empty_cache") {
      event.kind = AllocationEvent::Kind::release_cache;
    } else {
      return fail("unknown action '" + std::string(field(kAction)) +
                  "' (expected alloc, free or empty_cache)");
    }
    if (event.kind != AllocationEvent::Kind::release_cache) {  // its ptr and size are ignored
      const auto address = parse_u64(field(kPtr), true);
      if (!address)
        return fail("bad ptr '" + std::string(field(kPtr)) +
                    "' (expected 0x<hex> or a decimal id)");
      event.address = *address;
      const std::string_view size_text = field(kSize);
      if (size_text.empty() && event.kind == AllocationEvent::Kind::alloc)
        return fail("alloc without a size");
      if (!size_text.empty()) {
        const auto size = parse_u64(size_text, false);
        if (!size) return fail("bad size '" + std::string(size_text) + "' (expected a byte count)");
        event.size = *size;
      }
    }
    if (const std::string_view stream_text = field(kStream); !stream_text.empty()) {
      const auto stream = parse_u64(stream_text, true);
      if (!stream) return fail("bad stream '" + std::string(stream_text) + "'");
      event.stream = *stream;
    }
    if (const std::string_view time_text = field(kTime); !time_text.empty()) {
      const auto time = parse_u64(time_text, false);
      if (!time) return fail("bad time_ns '" + std::string(time_text) + "'");
      event.time_ns = *time;
    }
    result.trace.events.push_back(event);
  }
  return result;
}

AllocationTrace allocation_trace_from(const TraceFileContents& contents) {
  AllocationTrace trace;
  trace.format = AllocationTrace::Format::binary;
  trace.metadata = contents.metadata;
  std::uint64_t reserved = 0;
  for (std::size_t i = 0; i < contents.events.size(); ++i) {
    const TraceEvent& e = contents.events[i];
    const std::uint64_t location = contents.first_record_offset + i * kTraceRecordBytes;
    switch (e.kind) {
      case TraceEventKind::alloc:
      case TraceEventKind::free:
        trace.events.push_back({e.kind == TraceEventKind::alloc ? AllocationEvent::Kind::alloc
                                                                : AllocationEvent::Kind::free,
                                e.address, e.size, e.stream, e.time_ns, location});
        break;
      case TraceEventKind::segment_alloc:
        reserved += e.size;
        trace.recorded_peak_reserved_bytes = std::max(trace.recorded_peak_reserved_bytes, reserved);
        break;
      case TraceEventKind::segment_free:
        reserved -= std::min(reserved, e.size);
        break;
      case TraceEventKind::oom:
        ++trace.recorded_ooms;
        break;
      default:  // chunk, step (version 2) and op (version 3) events: nothing to replay
        break;
    }
  }
  return trace;
}

AllocationTraceResult load_allocation_trace(const std::string& path,
                                            const TraceLoadOptions& options) {
  AllocationTraceResult result;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    result.error = path + ": cannot open: " + std::strerror(errno);
    return result;
  }
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) {
    result.error = path + ": is a directory, not a trace";
    return result;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = std::move(buffer).str();
  if (bytes.empty()) {
    result.error = path + ": empty file: no trace, snapshot or CSV events in it";
    return result;
  }
  if (looks_like_trace_file(bytes) ||
      (bytes.size() < 8 && !bytes.empty() && std::string_view("SPWTRACE").starts_with(bytes))) {
    TraceReadResult read = parse_trace(bytes);
    if (!read.ok()) {
      result.error = path + ": " + read.error;
      return result;
    }
    result.trace = allocation_trace_from(*read.trace);
    return result;
  }
  if (looks_like_pickle(bytes)) {
    const PickleReadResult read = read_pickle(bytes);
    if (!read.ok()) {
      result.error = path + ": " + read.error;
      return result;
    }
    return allocation_trace_from_snapshot(read.document, options.snapshot_device, path);
  }
  if (looks_like_old_pickle(bytes)) {
    result.error =
        path +
        ": byte offset 0: a pickle of protocol 0 or 1; spillway-replay reads protocols 2 to 5 "
        "(torch.cuda.memory._dump_snapshot writes the default, 4 or 5). Write it again with "
        "pickle.dump(snapshot, f) or protocol=4";
    return result;
  }
  // Not a binary trace: CSV must be text.
  if (bytes.find('\0') != std::string::npos) {
    result.error = path + ": byte offset " + std::to_string(bytes.find('\0')) +
                   ": not a spillway trace (no \"SPWTRACE\" magic), a PyTorch memory snapshot (a "
                   "pickle) nor a CSV text file";
    return result;
  }
  return parse_allocation_csv(bytes, path);
}

}  // namespace spillway
