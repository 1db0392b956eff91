// Trace file (versions 1 to 4): writer and validating reader. Layout: trace_file.h
// and docs/trace-format.md (keep the two in step with the offsets below and
// in trace_record_layout.h).
#include "tracer/trace_file.h"

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tracer/op_event_check.h"
#include "tracer/op_name_records.h"
#include "tracer/trace_record_layout.h"

namespace spillway {

namespace {

// Fixed header offsets.
constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kHeaderSizeOffset = 12;
constexpr std::size_t kRecordSizeOffset = 16;
constexpr std::size_t kMetadataSizeOffset = 20;
constexpr std::size_t kMetadataCountOffset = 24;
constexpr std::size_t kFlagsOffset = 28;
constexpr std::size_t kHeaderCrcOffset = 32;
constexpr std::size_t kReservedOffset = 36;

// Caps that keep a corrupt length from asking for gigabytes.
constexpr std::size_t kMaxMetadataBytes = 1 << 20;

constexpr std::size_t align8(std::size_t n) { return (n + 7) & ~std::size_t{7}; }

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib's crc32().
constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

// Continues a CRC: crc32_update(crc32_update(0, a), b) == crc32 of a then b.
std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void store_le(unsigned char* out, std::uint64_t value, std::size_t width) {
  for (std::size_t i = 0; i < width; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}

std::uint64_t load_le(const unsigned char* in, std::size_t width) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < width; ++i) value |= std::uint64_t{in[i]} << (8 * i);
  return value;
}

void append_le(std::string& out, std::uint64_t value, std::size_t width) {
  unsigned char bytes[8];
  store_le(bytes, value, width);
  out.append(reinterpret_cast<const char*>(bytes), width);
}

// The whole header: fixed part, metadata, zero padding, CRC filled in.
std::string encode_header(const TraceMetadata& metadata) {
  std::string entries;
  for (const auto& [key, value] : metadata) {
    append_le(entries, key.size(), 4);
    entries += key;
    append_le(entries, value.size(), 4);
    entries += value;
  }
  const std::size_t header_size = align8(kTraceFixedHeaderBytes + entries.size());
  std::string header(kTraceFixedHeaderBytes, '\0');
  auto* h = reinterpret_cast<unsigned char*>(header.data());
  std::memcpy(h, kTraceMagic, sizeof kTraceMagic);
  store_le(h + kVersionOffset, kTraceFormatVersion, 4);
  store_le(h + kHeaderSizeOffset, header_size, 4);
  store_le(h + kRecordSizeOffset, kTraceRecordBytes, 4);
  store_le(h + kMetadataSizeOffset, entries.size(), 4);
  store_le(h + kMetadataCountOffset, metadata.size(), 4);
  header += entries;
  header.resize(header_size, '\0');
  const std::uint32_t crc = crc32_update(0, header.data(), header.size());
  store_le(reinterpret_cast<unsigned char*>(header.data()) + kHeaderCrcOffset, crc, 4);
  return header;
}

void encode_record(unsigned char* out, std::uint64_t time_ns, std::uint16_t kind,
                   std::uint64_t stream, std::uint64_t address, std::uint64_t size,
                   std::uint16_t detail = 0, std::uint32_t client = 0) {
  std::memset(out, 0, kTraceRecordBytes);
  store_le(out + kRecordTimeOffset, time_ns, 8);
  store_le(out + kRecordKindOffset, kind, 2);
  store_le(out + kRecordDetailOffset, detail, 2);
  store_le(out + kRecordClientOffset, client, 4);
  store_le(out + kRecordStreamOffset, stream, 8);
  store_le(out + kRecordAddressOffset, address, 8);
  store_le(out + kRecordSizeFieldOffset, size, 8);
}

// The end record's checksum covers every event record and then the end
// record's own first 32 bytes (time, kind, count), so no bit of the file goes
// unchecked.
constexpr std::size_t kEndRecordCheckedBytes = kRecordSizeFieldOffset;

void encode_end_record(unsigned char* out, std::uint64_t end_time_ns, std::uint64_t event_count,
                       std::uint32_t event_records_crc) {
  encode_record(out, end_time_ns, kTraceEndRecordKind, 0, event_count, 0);
  const std::uint32_t crc = crc32_update(event_records_crc, out, kEndRecordCheckedBytes);
  store_le(out + kRecordSizeFieldOffset, crc, 8);
}

void encode_event(unsigned char* out, const TraceEvent& e) {
  encode_record(out, e.time_ns, static_cast<std::uint16_t>(e.kind), e.stream, e.address, e.size,
                e.detail, e.client);
}

// Kinds are numbered densely from 1; each version knows a prefix of them.
bool is_event_kind_of_version(std::uint64_t kind, std::uint64_t version) {
  const TraceEventKind last = version == 1   ? kLastTraceEventKindV1
                              : version == 2 ? kLastTraceEventKindV2
                              : version == 3 ? kLastTraceEventKindV3
                                             : kLastTraceEventKind;
  return kind >= 1 && kind <= static_cast<std::uint64_t>(last);
}

// Allocator events carry no detail or client, in any version.
bool is_allocator_event_kind(std::uint64_t kind) {
  return kind <= static_cast<std::uint64_t>(kLastTraceEventKindV1) ||
         kind == static_cast<std::uint64_t>(TraceEventKind::spill_for_allocation) ||
         kind == static_cast<std::uint64_t>(TraceEventKind::min_budget);
}

std::string hex32(std::uint64_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08llx", static_cast<unsigned long long>(v));
  return text;
}

// Version 3's rules, beyond the kind: op names defined before use, in
// consecutive pieces; op_begin/op_end coherent; chunk_access says how.
// Earlier versions never get here with these kinds.
std::optional<TraceRecordProblem> check_version3_record(const TraceEvent& event,
                                                        OpNameAssembler& op_names,
                                                        OpEventCheck& op_events) {
  if (auto problem = op_names.add(event)) return problem;
  switch (event.kind) {
    case TraceEventKind::op_begin:
    case TraceEventKind::op_end:
      return op_events.check(event, op_names.names());
    case TraceEventKind::chunk_access:
      if (event.detail != kTraceDetailRead && event.detail != kTraceDetailReadWrite)
        return TraceRecordProblem{
            kRecordDetailOffset,
            "chunk_access detail " + std::to_string(event.detail) + " (1 read, 2 read_write)"};
      return std::nullopt;
    case TraceEventKind::chunk_release:
      if (event.detail != 0)
        return TraceRecordProblem{kRecordDetailOffset, "chunk_release detail is not zero"};
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// Builds "byte offset N: what" errors.
TraceReadResult fail_at(std::size_t offset, const std::string& what) {
  TraceReadResult result;
  result.error = "byte offset " + std::to_string(offset) + ": " + what;
  return result;
}

}  // namespace

std::optional<std::string> find_metadata(const TraceMetadata& metadata, std::string_view key) {
  for (const auto& [k, v] : metadata)
    if (k == key) return v;
  return std::nullopt;
}

// ---- Writer ----

std::unique_ptr<TraceFileWriter> TraceFileWriter::create(const std::string& path,
                                                         const TraceMetadata& metadata,
                                                         std::string* error) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    if (error) *error = "cannot create trace file '" + path + "': " + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<TraceFileWriter> writer(new TraceFileWriter(path, file));
  const std::string header = encode_header(metadata);
  if (!writer->write_bytes(header.data(), header.size())) {
    if (error) *error = writer->error_;
    return nullptr;
  }
  return writer;
}

TraceFileWriter::~TraceFileWriter() {
  if (file_ != nullptr) finish();
}

bool TraceFileWriter::write_bytes(const void* data, std::size_t size) {
  if (file_ == nullptr) {
    if (error_.empty()) error_ = "trace file '" + path_ + "' is already finished";
    return false;
  }
  if (!error_.empty()) return false;
  if (std::fwrite(data, 1, size, file_) != size) {
    error_ = "writing trace file '" + path_ + "' failed: " + std::strerror(errno);
    return false;
  }
  return true;
}

bool TraceFileWriter::write(std::span<const TraceEvent> events) {
  // Encode in blocks so a batch is a few large fwrite calls.
  constexpr std::size_t kBlockRecords = 256;
  unsigned char block[kBlockRecords * kTraceRecordBytes];
  std::size_t done = 0;
  while (done < events.size()) {
    const std::size_t count = std::min(kBlockRecords, events.size() - done);
    for (std::size_t i = 0; i < count; ++i) {
      const TraceEvent& e = events[done + i];
      encode_event(block + i * kTraceRecordBytes, e);
    }
    const std::size_t bytes = count * kTraceRecordBytes;
    if (!write_bytes(block, bytes)) return false;
    records_crc_ = crc32_update(records_crc_, block, bytes);
    events_written_ += count;
    done += count;
  }
  return true;
}

bool TraceFileWriter::flush() {
  if (file_ == nullptr || !error_.empty()) return error_.empty();
  if (std::fflush(file_) != 0) {
    error_ = "flushing trace file '" + path_ + "' failed: " + std::strerror(errno);
    return false;
  }
  return true;
}

bool TraceFileWriter::finish(std::uint64_t end_time_ns) {
  if (file_ == nullptr) return error_.empty();
  unsigned char end[kTraceRecordBytes];
  encode_end_record(end, end_time_ns, events_written_, records_crc_);
  write_bytes(end, sizeof end);
  if (std::fclose(file_) != 0 && error_.empty())
    error_ = "closing trace file '" + path_ + "' failed: " + std::strerror(errno);
  file_ = nullptr;
  return error_.empty();
}

std::string encode_trace(const TraceMetadata& metadata, std::span<const TraceEvent> events,
                         std::uint64_t end_time_ns) {
  std::string out = encode_header(metadata);
  const std::size_t records_start = out.size();
  out.resize(records_start + (events.size() + 1) * kTraceRecordBytes);
  auto* records = reinterpret_cast<unsigned char*>(out.data()) + records_start;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    encode_event(records + i * kTraceRecordBytes, e);
  }
  const std::size_t event_bytes = events.size() * kTraceRecordBytes;
  encode_end_record(records + event_bytes, end_time_ns, events.size(),
                    crc32_update(0, records, event_bytes));
  return out;
}

// ---- Reader ----

bool looks_like_trace_file(std::string_view bytes) {
  return bytes.size() >= sizeof kTraceMagic &&
         std::memcmp(bytes.data(), kTraceMagic, sizeof kTraceMagic) == 0;
}

// Checks, in order: magic, version (before anything a newer version may have
// changed), header fields, header length, CRC, metadata; then each record.
// Every length is compared with what is left before it is used.
TraceReadResult parse_trace(std::string_view bytes, TraceReadOptions options) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t file_size = bytes.size();

  const std::size_t magic_checked = std::min(file_size, sizeof kTraceMagic);
  for (std::size_t i = 0; i < magic_checked; ++i)
    if (bytes[i] != kTraceMagic[i])
      return fail_at(i, "not a spillway trace file (the file must start with \"SPWTRACE\")");
  if (file_size < kTraceFixedHeaderBytes)
    return fail_at(file_size, "file ends inside the " + std::to_string(kTraceFixedHeaderBytes) +
                                  "-byte fixed header (truncated)");

  const std::uint64_t version = load_le(data + kVersionOffset, 4);
  if (version < kOldestTraceFormatVersion || version > kTraceFormatVersion) {
    return fail_at(kVersionOffset,
                   "trace format version " + std::to_string(version) +
                       (version > kTraceFormatVersion ? " is newer than" : " is not") +
                       " a version this reader supports (" +
                       std::to_string(kOldestTraceFormatVersion) + " to " +
                       std::to_string(kTraceFormatVersion) + ")");
  }
  const std::uint64_t header_size = load_le(data + kHeaderSizeOffset, 4);
  const std::uint64_t record_size = load_le(data + kRecordSizeOffset, 4);
  const std::uint64_t metadata_size = load_le(data + kMetadataSizeOffset, 4);
  const std::uint64_t metadata_count = load_le(data + kMetadataCountOffset, 4);
  if (record_size != kTraceRecordBytes)
    return fail_at(kRecordSizeOffset, "record size " + std::to_string(record_size) +
                                          " (records are " + std::to_string(kTraceRecordBytes) +
                                          " bytes)");
  if (metadata_size > kMaxMetadataBytes)
    return fail_at(kMetadataSizeOffset,
                   "metadata size " + std::to_string(metadata_size) + " exceeds the 1 MiB limit");
  if (header_size != align8(kTraceFixedHeaderBytes + metadata_size))
    return fail_at(kHeaderSizeOffset,
                   "header size " + std::to_string(header_size) + " does not match metadata size " +
                       std::to_string(metadata_size) + " (expected " +
                       std::to_string(align8(kTraceFixedHeaderBytes + metadata_size)) + ")");
  if (load_le(data + kFlagsOffset, 4) != 0)
    return fail_at(kFlagsOffset, "flags are not zero (no version defines flags)");
  if (load_le(data + kReservedOffset, 4) != 0)
    return fail_at(kReservedOffset, "reserved header field is not zero");
  if (file_size < header_size)
    return fail_at(file_size, "file ends inside the " + std::to_string(header_size) +
                                  "-byte header (truncated)");

  // CRC over the header with its own CRC field read as zero.
  std::string header_copy(bytes.substr(0, header_size));
  std::memset(header_copy.data() + kHeaderCrcOffset, 0, 4);
  const std::uint32_t stored_crc = static_cast<std::uint32_t>(load_le(data + kHeaderCrcOffset, 4));
  const std::uint32_t computed_crc = crc32_update(0, header_copy.data(), header_copy.size());
  if (stored_crc != computed_crc)
    return fail_at(kHeaderCrcOffset, "header checksum mismatch (stored " + hex32(stored_crc) +
                                         ", computed " + hex32(computed_crc) +
                                         "): the header is corrupt");

  TraceFileContents contents;
  contents.format_version = static_cast<std::uint32_t>(version);
  contents.first_record_offset = header_size;
  std::size_t at = kTraceFixedHeaderBytes;
  const std::size_t metadata_end = kTraceFixedHeaderBytes + metadata_size;
  auto read_string = [&](std::string* out, const char* what) -> std::optional<TraceReadResult> {
    if (metadata_end - at < 4)
      return fail_at(at, std::string("metadata ends before the length of a ") + what);
    const std::uint64_t length = load_le(data + at, 4);
    at += 4;
    if (length > metadata_end - at)
      return fail_at(at - 4, std::string("metadata ") + what + " length " + std::to_string(length) +
                                 " runs past the metadata");
    out->assign(bytes.data() + at, length);
    at += length;
    return std::nullopt;
  };
  for (std::uint64_t i = 0; i < metadata_count; ++i) {
    std::string key, value;
    if (auto error = read_string(&key, "key")) return *error;
    if (auto error = read_string(&value, "value")) return *error;
    contents.metadata.emplace_back(std::move(key), std::move(value));
  }
  if (at != metadata_end)
    return fail_at(
        at, std::to_string(metadata_end - at) + " bytes of metadata left after the last entry");
  for (std::size_t i = metadata_end; i < header_size; ++i)
    if (data[i] != 0) return fail_at(i, "header padding is not zero");

  // Records.
  std::uint32_t records_crc = 0;
  OpNameAssembler op_names;  // version 3: op_name runs
  OpEventCheck op_events;    // version 3: op_begin/op_end coherence
  std::size_t offset = header_size;
  while (true) {
    if (offset == file_size) {
      if (options.allow_missing_end) break;
      return fail_at(offset,
                     "file ends without the end record (truncated, or the writer did "
                     "not finish)");
    }
    if (file_size - offset < kTraceRecordBytes)
      return fail_at(file_size, "file ends inside the record that starts at byte offset " +
                                    std::to_string(offset) + " (truncated)");
    const unsigned char* r = data + offset;
    const std::uint64_t kind = load_le(r + kRecordKindOffset, 2);
    const std::uint64_t detail = load_le(r + kRecordDetailOffset, 2);
    const std::uint64_t client = load_le(r + kRecordClientOffset, 4);
    // The kind first: a kind the version does not define says more than its fields.
    if (kind != kTraceEndRecordKind && !is_event_kind_of_version(kind, version))
      return fail_at(offset + kRecordKindOffset, "unknown event kind " + std::to_string(kind) +
                                                     " for format version " +
                                                     std::to_string(version));
    const bool has_detail_fields =
        version >= 2 && kind != kTraceEndRecordKind && !is_allocator_event_kind(kind);
    if (!has_detail_fields && (detail != 0 || client != 0))
      return fail_at(offset + kRecordDetailOffset,
                     "reserved bytes of the record are not zero (corrupt record)");
    if (kind == kTraceEndRecordKind) {
      if (op_names.in_progress())
        return fail_at(offset + kRecordKindOffset,
                       "end record inside an op_name definition (its pieces are missing)");
      const std::uint64_t count = load_le(r + kRecordAddressOffset, 8);
      const std::uint64_t crc = load_le(r + kRecordSizeFieldOffset, 8);
      if (load_le(r + kRecordStreamOffset, 8) != 0)
        return fail_at(offset + kRecordStreamOffset, "end record: stream field is not zero");
      if (count != contents.events.size())
        return fail_at(offset + kRecordAddressOffset,
                       "end record counts " + std::to_string(count) + " events but " +
                           std::to_string(contents.events.size()) + " precede it");
      records_crc = crc32_update(records_crc, r, kEndRecordCheckedBytes);
      if (crc != records_crc)
        return fail_at(offset + kRecordSizeFieldOffset,
                       "records checksum mismatch (stored " + hex32(crc) + ", computed " +
                           hex32(records_crc) + "): a record is corrupt");
      if (offset + kTraceRecordBytes != file_size)
        return fail_at(
            offset + kTraceRecordBytes,
            std::to_string(file_size - offset - kTraceRecordBytes) + " bytes after the end record");
      contents.finished = true;
      contents.end_time_ns = load_le(r + kRecordTimeOffset, 8);
      break;
    }
    TraceEvent event;
    event.time_ns = load_le(r + kRecordTimeOffset, 8);
    event.kind = static_cast<TraceEventKind>(kind);
    event.stream = load_le(r + kRecordStreamOffset, 8);
    event.address = load_le(r + kRecordAddressOffset, 8);
    event.size = load_le(r + kRecordSizeFieldOffset, 8);
    event.detail = static_cast<std::uint16_t>(detail);
    event.client = static_cast<std::uint32_t>(client);
    if (auto problem = check_version3_record(event, op_names, op_events))
      return fail_at(offset + problem->field_offset, problem->what);
    contents.events.push_back(event);
    records_crc = crc32_update(records_crc, r, kTraceRecordBytes);
    offset += kTraceRecordBytes;
  }
  // A definition cut by a missing end record (allow_missing_end) is left out.
  contents.op_names = op_names.names();
  TraceReadResult result;
  result.trace = std::move(contents);
  return result;
}

TraceReadResult read_trace_file(const std::string& path, TraceReadOptions options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TraceReadResult result;
    result.error = path + ": cannot open: " + std::strerror(errno);
    return result;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    TraceReadResult result;
    result.error = path + ": read error";
    return result;
  }
  const std::string bytes = std::move(buffer).str();
  TraceReadResult result = parse_trace(bytes, options);
  if (!result.ok()) result.error = path + ": " + result.error;
  return result;
}

}  // namespace spillway
