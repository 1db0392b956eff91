// Op-name records: encoding a name into op_name pieces, and checking a file's
// pieces as they come. Layout: op_name_records.h, docs/trace-format.md.
#include "tracer/op_name_records.h"

#include <algorithm>

#include "tracer/trace_record_layout.h"

namespace spillway {

namespace {

// The name bytes of a piece live in stream, address and size, little-endian:
// byte i of the piece is byte i of the record's last 24 bytes.
void store_piece_bytes(std::string_view bytes, TraceEvent* piece) {
  std::uint64_t words[3] = {0, 0, 0};
  for (std::size_t i = 0; i < bytes.size(); ++i)
    words[i / 8] |= std::uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * (i % 8));
  piece->stream = words[0];
  piece->address = words[1];
  piece->size = words[2];
}

unsigned char piece_byte(const TraceEvent& piece, std::size_t i) {
  const std::uint64_t words[3] = {piece.stream, piece.address, piece.size};
  return static_cast<unsigned char>(words[i / 8] >> (8 * (i % 8)));
}

TraceRecordProblem problem(std::size_t field_offset, std::string what) {
  return {field_offset, std::move(what)};
}

}  // namespace

std::vector<TraceEvent> op_name_records(std::uint32_t id, std::string_view name,
                                        std::uint64_t time_ns) {
  name = name.substr(0, kMaxOpNameBytes);
  std::vector<TraceEvent> records;
  records.reserve(1 + (name.size() + kOpNameBytesPerRecord - 1) / kOpNameBytesPerRecord);
  TraceEvent head;
  head.time_ns = time_ns;
  head.kind = TraceEventKind::op_name;
  head.client = id;
  head.stream = name.size();
  records.push_back(head);
  for (std::size_t at = 0; at < name.size(); at += kOpNameBytesPerRecord) {
    TraceEvent piece;
    piece.time_ns = time_ns;
    piece.kind = TraceEventKind::op_name;
    piece.client = id;
    piece.detail = static_cast<std::uint16_t>(records.size());
    store_piece_bytes(name.substr(at, kOpNameBytesPerRecord), &piece);
    records.push_back(piece);
  }
  return records;
}

std::optional<TraceRecordProblem> OpNameAssembler::add(const TraceEvent& event) {
  if (pending_) {
    if (event.kind != TraceEventKind::op_name)
      return problem(kRecordKindOffset, "op name " + std::to_string(pending_->id) +
                                            " is missing piece " +
                                            std::to_string(pending_->next_piece) +
                                            " (op_name pieces must be consecutive)");
    return extend(event);
  }
  if (event.kind != TraceEventKind::op_name) return std::nullopt;
  return open(event);
}

std::optional<TraceRecordProblem> OpNameAssembler::open(const TraceEvent& event) {
  if (event.detail != 0)
    return problem(kRecordDetailOffset,
                   "op_name piece " + std::to_string(event.detail) + " without piece 0 before it");
  if (names_.contains(event.client))
    return problem(kRecordClientOffset,
                   "op name id " + std::to_string(event.client) + " is defined twice");
  if (event.stream > kMaxOpNameBytes)
    return problem(kRecordStreamOffset, "op name length " + std::to_string(event.stream) +
                                            " exceeds " + std::to_string(kMaxOpNameBytes));
  if (event.address != 0 || event.size != 0)
    return problem(event.address != 0 ? kRecordAddressOffset : kRecordSizeFieldOffset,
                   "op_name piece 0: reserved field is not zero");
  pending_ = Pending{event.client, static_cast<std::size_t>(event.stream), 1, {}};
  complete_if_done();
  return std::nullopt;
}

std::optional<TraceRecordProblem> OpNameAssembler::extend(const TraceEvent& event) {
  Pending& name = *pending_;
  if (event.client != name.id)
    return problem(kRecordClientOffset, "op_name piece for id " + std::to_string(event.client) +
                                            " inside the definition of op name id " +
                                            std::to_string(name.id));
  if (event.detail != name.next_piece)
    return problem(kRecordDetailOffset, "op_name piece " + std::to_string(event.detail) +
                                            " where piece " + std::to_string(name.next_piece) +
                                            " of op name id " + std::to_string(name.id) +
                                            " belongs");
  const std::size_t count = std::min(kOpNameBytesPerRecord, name.length - name.bytes.size());
  for (std::size_t i = count; i < kOpNameBytesPerRecord; ++i)
    if (piece_byte(event, i) != 0)
      return problem(kRecordStreamOffset + i, "op_name padding is not zero");
  for (std::size_t i = 0; i < count; ++i)
    name.bytes.push_back(static_cast<char>(piece_byte(event, i)));
  ++name.next_piece;
  complete_if_done();
  return std::nullopt;
}

void OpNameAssembler::complete_if_done() {
  if (pending_->bytes.size() < pending_->length) return;
  names_.emplace(pending_->id, std::move(pending_->bytes));
  pending_.reset();
}

}  // namespace spillway
