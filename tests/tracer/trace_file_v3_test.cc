// Trace file version 3: op names, op begin/end and chunk access/release
// round-trip; every incoherent record is rejected with its byte offset; the
// independent Python writer's file (tools/tracegen) reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/tracer/trace_test_support.h"
#include "tracer/op_name_records.h"
#include "tracer/trace_file.h"

namespace spillway {
namespace {

using testing::with_format_version;

constexpr std::uint64_t kCapacity = 64 << 20;
constexpr std::uint64_t kThread = 77;

void append(std::vector<TraceEvent>& events, const std::vector<TraceEvent>& more) {
  events.insert(events.end(), more.begin(), more.end());
}

// "aten::addmm" (two op_name records), then one op using chunk 3, then a step.
std::vector<TraceEvent> sample_v3_events() {
  std::vector<TraceEvent> events = op_name_records(1, "aten::addmm", 90);  // records 0, 1
  events.push_back({100, TraceEventKind::op_begin, kThread, 1, 0, 0, 1});  // 2
  events.push_back({110, TraceEventKind::chunk_fetch, kCapacity, 3, 4096, 0, 7});
  events.push_back({120, TraceEventKind::chunk_access, kCapacity, 3, 12, kTraceDetailRead, 7});
  events.push_back({140, TraceEventKind::chunk_release, kCapacity, 3, 12, 0, 7});  // 5
  events.push_back({150, TraceEventKind::op_end, kThread, 1, 50, 0, 1});           // 6
  events.push_back({160, TraceEventKind::step, 0, 1, 0});                          // 7
  return events;
}

// The byte offset of field `field` of record `index` in encode_trace({}, ...).
std::size_t at(std::size_t index, std::size_t field) { return 40 + 40 * index + field; }

bool same_event(const TraceEvent& a, const TraceEvent& b) {
  return a.time_ns == b.time_ns && a.kind == b.kind && a.stream == b.stream &&
         a.address == b.address && a.size == b.size && a.detail == b.detail && a.client == b.client;
}

void expect_rejected(const std::vector<TraceEvent>& events, std::size_t offset,
                     const std::string& what) {
  const TraceReadResult result = parse_trace(encode_trace({}, events));
  ASSERT_FALSE(result.ok()) << "expected: " << what;
  EXPECT_NE(result.error.find("byte offset " + std::to_string(offset) + ": "), std::string::npos)
      << result.error;
  EXPECT_NE(result.error.find(what), std::string::npos) << result.error;
}

TEST(tracer_TraceFileV3, OpsAndChunkUsesRoundTripWithTheirNames) {
  const std::vector<TraceEvent> events = sample_v3_events();
  const TraceReadResult result = parse_trace(encode_trace({{"writer", "test"}}, events, 200));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version,
            kTraceFormatVersion);                         // version 3's kinds, as written now
  ASSERT_EQ(result.trace->events.size(), events.size());  // op_name pieces included
  for (std::size_t i = 0; i < events.size(); ++i)
    EXPECT_TRUE(same_event(result.trace->events[i], events[i])) << i;
  ASSERT_EQ(result.trace->op_names.size(), 1u);
  EXPECT_EQ(result.trace->op_names.at(1), "aten::addmm");
}

// Piece boundaries: empty, inside the first piece, exactly one and two
// pieces, just past them, long, and the longest allowed.
TEST(tracer_TraceFileV3, NamesOfEveryLengthRoundTrip) {
  const std::vector<std::string> names = {
      "",
      "a",
      std::string(23, 'b'),
      std::string(24, 'c'),
      std::string(25, 'd'),
      std::string(48, 'e'),
      "aten::_scaled_dot_product_efficient_attention_backward.default",
      std::string(kMaxOpNameBytes, 'z')};
  std::vector<TraceEvent> events;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto id = static_cast<std::uint32_t>(i + 1);
    const std::vector<TraceEvent> pieces = op_name_records(id, names[i], i);
    EXPECT_EQ(pieces.size(), 1 + (names[i].size() + 23) / 24) << names[i];
    append(events, pieces);
    events.push_back({1000 + i, TraceEventKind::op_begin, kThread, i + 1, 0, 0, id});
    events.push_back({1000 + i, TraceEventKind::op_end, kThread, i + 1, 0, 0, id});
  }
  const TraceReadResult result = parse_trace(encode_trace({}, events));
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.trace->op_names.size(), names.size());
  for (std::size_t i = 0; i < names.size(); ++i)
    EXPECT_EQ(result.trace->op_names.at(static_cast<std::uint32_t>(i + 1)), names[i]);
}

TEST(tracer_TraceFileV3, WriterCutsNamesPastTheLimit) {
  const std::string name(kMaxOpNameBytes + 100, 'n');
  const TraceReadResult result = parse_trace(encode_trace({}, op_name_records(1, name, 0)));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->op_names.at(1), name.substr(0, kMaxOpNameBytes));
}

TEST(tracer_TraceFileV3, EveryTruncationAndBitFlipIsRejected) {
  const std::string bytes = encode_trace({{"k", "v"}}, sample_v3_events());
  for (std::size_t cut = 0; cut < bytes.size(); ++cut)
    ASSERT_FALSE(parse_trace(std::string_view(bytes).substr(0, cut)).ok()) << cut;
  for (std::size_t byte = 0; byte < bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string corrupt = bytes;
      corrupt[byte] = static_cast<char>(corrupt[byte] ^ (1 << bit));
      ASSERT_FALSE(parse_trace(corrupt).ok()) << "bit " << bit << " of byte " << byte;
    }
  }
}

TEST(tracer_TraceFileV3, OpEventWithAnUndefinedNameIsRejected) {
  std::vector<TraceEvent> events = sample_v3_events();
  events[2].client = 9;
  expect_rejected(events, at(2, 12), "op_begin of op 1 uses op name id 9, which no op_name record");
  // The definition after the use does not count.
  events = sample_v3_events();
  std::rotate(events.begin(), events.begin() + 2, events.begin() + 7);  // the op, then the name
  expect_rejected(events, at(0, 12), "uses op name id 1, which no op_name record before it");
}

TEST(tracer_TraceFileV3, IncoherentOpNameRunsAreRejected) {
  // Another record between piece 0 and piece 1.
  std::vector<TraceEvent> events = sample_v3_events();
  events.insert(events.begin() + 1, TraceEvent{95, TraceEventKind::step, 0, 1, 0});
  expect_rejected(events, at(1, 8), "op name 1 is missing piece 1");
  // A piece out of order.
  events = sample_v3_events();
  events[1].detail = 2;
  expect_rejected(events, at(1, 10), "op_name piece 2 where piece 1 of op name id 1 belongs");
  // A piece of another id inside the run.
  events = sample_v3_events();
  events[1].client = 2;
  expect_rejected(events, at(1, 12),
                  "op_name piece for id 2 inside the definition of op name id 1");
  // A piece with no piece 0 before it.
  events = sample_v3_events();
  events.erase(events.begin());
  expect_rejected(events, at(0, 10), "op_name piece 1 without piece 0 before it");
  // The same id twice.
  events = sample_v3_events();
  const std::vector<TraceEvent> again = op_name_records(1, "aten::mm", 155);
  events.insert(events.end() - 1, again.begin(), again.end());
  expect_rejected(events, at(7, 12), "op name id 1 is defined twice");
  // Non-zero bytes past the name ("aten::addmm" is 11 bytes).
  events = sample_v3_events();
  events[1].address |= std::uint64_t{0x41} << 24;  // byte 11 of the piece
  expect_rejected(events, at(1, 16 + 11), "op_name padding is not zero");
  // A declared length past the limit, and piece 0's reserved fields.
  events = sample_v3_events();
  events[0].stream = kMaxOpNameBytes + 1;
  expect_rejected(events, at(0, 16), "op name length 4097 exceeds 4096");
  events = sample_v3_events();
  events[0].size = 1;
  expect_rejected(events, at(0, 32), "op_name piece 0: reserved field is not zero");
  // The file ends (end record) inside a definition.
  events = op_name_records(1, std::string(30, 'x'), 0);
  events.pop_back();  // pieces 0 and 1 of 2; the end record is record 2
  expect_rejected(events, at(2, 8), "end record inside an op_name definition");
}

TEST(tracer_TraceFileV3, IncoherentOpEventsAreRejected) {
  std::vector<TraceEvent> events = sample_v3_events();
  events[6].address = 2;  // closes an op that never began
  expect_rejected(events, at(6, 24), "op_end of op 2, which no open op_begin starts");
  events = sample_v3_events();
  events[6].size = 49;  // 150 - 100 is 50
  expect_rejected(events, at(6, 32), "op_end of op 1: duration 49 ns is not its end time minus");
  events = sample_v3_events();
  events[6].stream = kThread + 1;
  expect_rejected(events, at(6, 16), "op_end of op 1: thread 78 differs from its op_begin's 77");
  events = sample_v3_events();
  append(events, op_name_records(2, "aten::mm", 151));  // records 8, 9
  events[6].client = 2;
  std::rotate(events.begin() + 6, events.begin() + 8, events.end());  // name 2 before the end
  expect_rejected(events, at(8, 12), "op_end of op 1: op name id 2 differs from its op_begin's 1");
  events = sample_v3_events();
  events.insert(events.begin() + 3, events[2]);  // begins op 1 twice
  expect_rejected(events, at(3, 24), "op_begin of op 1: that op is already open");
  events = sample_v3_events();
  events[2].address = 0;
  expect_rejected(events, at(2, 24), "op_begin: sequence number 0");
  events = sample_v3_events();
  events[2].detail = 1;
  expect_rejected(events, at(2, 10), "op_begin of op 1: detail is not zero");
}

TEST(tracer_TraceFileV3, ChunkUsesSayHowTheChunkIsUsed) {
  std::vector<TraceEvent> events = sample_v3_events();
  events[4].detail = kTraceDetailReadWrite;
  EXPECT_TRUE(parse_trace(encode_trace({}, events)).ok());
  events[4].detail = 0;
  expect_rejected(events, at(4, 10), "chunk_access detail 0 (1 read, 2 read_write)");
  events = sample_v3_events();
  events[5].detail = 1;
  expect_rejected(events, at(5, 10), "chunk_release detail is not zero");
}

// An op still open at the end is fine: the trace was closed inside it.
TEST(tracer_TraceFileV3, OpenOpsAtTheEndAreAccepted) {
  std::vector<TraceEvent> events = sample_v3_events();
  events.erase(events.begin() + 6);
  EXPECT_TRUE(parse_trace(encode_trace({}, events)).ok());
}

TEST(tracer_TraceFileV3, CutInsideANameLeavesItOutWhenTheEndMayBeMissing) {
  std::vector<TraceEvent> events = op_name_records(1, "aten::addmm", 0);
  append(events, op_name_records(2, std::string(30, 'x'), 1));  // 3 records
  const std::string bytes = encode_trace({}, events);
  const auto cut = std::string_view(bytes).substr(0, 40 + 4 * 40);  // inside name 2
  const TraceReadResult result = parse_trace(cut, {.allow_missing_end = true});
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->events.size(), 4u);
  ASSERT_EQ(result.trace->op_names.size(), 1u);
  EXPECT_EQ(result.trace->op_names.at(1), "aten::addmm");
}

// Kinds are checked against the file's version before anything else.
TEST(tracer_TraceFileV3, OlderVersionsRejectVersion3Kinds) {
  std::vector<TraceEvent> events = sample_v3_events();
  TraceReadResult result = parse_trace(with_format_version(encode_trace({}, events), 2));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset " + std::to_string(at(0, 8)) +
                              ": unknown event kind 11 for format version 2"),
            std::string::npos)
      << result.error;
  events = {{100, TraceEventKind::chunk_access, kCapacity, 3, 12, kTraceDetailRead, 7}};
  result = parse_trace(with_format_version(encode_trace({}, events), 1));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset " + std::to_string(at(0, 8)) +
                              ": unknown event kind 14 for format version 1"),
            std::string::npos)
      << result.error;
}

// tools/tracegen/make_traces.py writes version 3 from docs/trace-format.md
// alone; the C++ reader must accept it and see the same ops.
TEST(tracer_TraceFileV3, ReadsTheIndependentPythonWritersFile) {
#ifndef SPILLWAY_TRACEGEN_PYTHON
  GTEST_SKIP() << "no python3 at configure time";
#else
  const auto path = std::filesystem::temp_directory_path() /
                    ("spillway_v3_sample_" + std::to_string(::getpid()) + ".trace");
  const std::string command = std::string(SPILLWAY_TRACEGEN_PYTHON) + " " +
                              SPILLWAY_SOURCE_DIR "/tools/tracegen/make_traces.py --v3-sample " +
                              path.string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const TraceReadResult result = read_trace_file(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, 3u);
  EXPECT_EQ(find_metadata(result.trace->metadata, "writer"), "tools/tracegen/make_traces.py");
  // Four names, one empty and one longer than three pieces.
  ASSERT_EQ(result.trace->op_names.size(), 4u);
  EXPECT_EQ(result.trace->op_names.at(1), "aten::linear");
  EXPECT_EQ(result.trace->op_names.at(2), "aten::addmm");
  EXPECT_GT(result.trace->op_names.at(3).size(), 3 * kOpNameBytesPerRecord);
  EXPECT_EQ(result.trace->op_names.at(4), "");
  int begins = 0, ends = 0, accesses = 0, releases = 0, steps = 0;
  std::uint64_t addmm_parent = 0;
  for (const TraceEvent& e : result.trace->events) {
    begins += e.kind == TraceEventKind::op_begin;
    ends += e.kind == TraceEventKind::op_end;
    accesses += e.kind == TraceEventKind::chunk_access;
    releases += e.kind == TraceEventKind::chunk_release;
    steps += e.kind == TraceEventKind::step;
    if (e.kind == TraceEventKind::op_begin && e.client == 2 && addmm_parent == 0)
      addmm_parent = e.size;
  }
  EXPECT_EQ(begins, 8);
  EXPECT_EQ(ends, 8);
  EXPECT_EQ(accesses, 6);
  EXPECT_EQ(releases, 6);
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(addmm_parent, 1u);  // inside the first aten::linear
#endif
}

}  // namespace
}  // namespace spillway
