// Trace file: round trip, and rejection of every truncation, every header
// bit flip, every record bit flip and unknown versions, each with its offset;
// versions 1 and 2 still read. Version 3's records: trace_file_v3_test.cc.
#include "tracer/trace_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/tracer/trace_test_support.h"

namespace spillway {
namespace {

using testing::with_format_version;

std::vector<TraceEvent> sample_events() {
  return {
      {100, TraceEventKind::segment_alloc, 0, 0x7f0000000000, 2 << 20},
      {110, TraceEventKind::alloc, 0, 0x7f0000000000, 512},
      {120, TraceEventKind::alloc, 7, 0x7f0000000200, 1536},
      {130, TraceEventKind::free, 0, 0x7f0000000000, 512},
      {140, TraceEventKind::oom, 7, 0, 1ull << 40},
  };
}

TraceMetadata sample_metadata() {
  return {{"device", "sim (4.00 GiB)"}, {"device_budget_bytes", "1000000"}, {"odd", ""}};
}

bool same_event(const TraceEvent& a, const TraceEvent& b) {
  return a.time_ns == b.time_ns && a.kind == b.kind && a.stream == b.stream &&
         a.address == b.address && a.size == b.size && a.detail == b.detail && a.client == b.client;
}

void expect_same_events(const std::vector<TraceEvent>& got, const std::vector<TraceEvent>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_event(got[i], want[i])) << i;
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("spillway_trace_file_" + name + "_" + std::to_string(::getpid()));
}

TEST(tracer_TraceFile, RoundTripInMemory) {
  const auto events = sample_events();
  const std::string bytes = encode_trace(sample_metadata(), events, 999);
  EXPECT_TRUE(looks_like_trace_file(bytes));
  const TraceReadResult result = parse_trace(bytes);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, kTraceFormatVersion);
  EXPECT_EQ(result.trace->metadata, sample_metadata());
  EXPECT_TRUE(result.trace->finished);
  EXPECT_EQ(result.trace->end_time_ns, 999u);
  expect_same_events(result.trace->events, events);
  EXPECT_EQ(find_metadata(result.trace->metadata, "device"), "sim (4.00 GiB)");
  EXPECT_FALSE(find_metadata(result.trace->metadata, "absent").has_value());
}

TEST(tracer_TraceFile, RoundTripThroughWriter) {
  const auto path = temp_path("roundtrip");
  const auto events = sample_events();
  std::string error;
  auto writer = TraceFileWriter::create(path.string(), sample_metadata(), &error);
  ASSERT_NE(writer, nullptr) << error;
  ASSERT_TRUE(writer->write(std::span(events).first(2)));
  ASSERT_TRUE(writer->write(std::span(events).subspan(2)));
  ASSERT_TRUE(writer->finish(999));
  EXPECT_EQ(writer->events_written(), events.size());
  EXPECT_FALSE(writer->write(events));  // finished
  const TraceReadResult result = read_trace_file(path.string());
  ASSERT_TRUE(result.ok()) << result.error;
  expect_same_events(result.trace->events, events);
  // The writer and the in-memory encoder produce the same bytes.
  std::ifstream in(path, std::ios::binary);
  const std::string file_bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(file_bytes, encode_trace(sample_metadata(), events, 999));
  std::filesystem::remove(path);
}

TEST(tracer_TraceFile, EmptyTraceRoundTrips) {
  const TraceReadResult result = parse_trace(encode_trace({}, {}));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_TRUE(result.trace->events.empty());
  EXPECT_TRUE(result.trace->metadata.empty());
}

TEST(tracer_TraceFile, LayoutMatchesTheDocumentedOffsets) {
  const std::string bytes = encode_trace({{"k", "v"}}, sample_events());
  ASSERT_EQ(bytes.substr(0, 8), "SPWTRACE");
  auto u32 = [&](std::size_t at) {
    return std::uint32_t(std::uint8_t(bytes[at])) |
           std::uint32_t(std::uint8_t(bytes[at + 1])) << 8 |
           std::uint32_t(std::uint8_t(bytes[at + 2])) << 16 |
           std::uint32_t(std::uint8_t(bytes[at + 3])) << 24;
  };
  EXPECT_EQ(u32(8), 4u);    // version
  EXPECT_EQ(u32(12), 56u);  // header size: align8(40 + 4+1+4+1)
  EXPECT_EQ(u32(16), 40u);  // record size
  EXPECT_EQ(u32(20), 10u);  // metadata size
  EXPECT_EQ(u32(24), 1u);   // metadata count
  EXPECT_EQ(bytes.size(), 56u + 6 * 40);
  // The first record: time 100, kind 3 (segment_alloc).
  EXPECT_EQ(u32(56), 100u);
  EXPECT_EQ(std::uint8_t(bytes[56 + 8]), 3);
}

TEST(tracer_TraceFile, TruncationAtEveryOffsetIsRejectedWithTheOffset) {
  const std::string bytes = encode_trace(sample_metadata(), sample_events());
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    const TraceReadResult result = parse_trace(std::string_view(bytes).substr(0, cut));
    ASSERT_FALSE(result.ok()) << "cut at " << cut;
    EXPECT_NE(result.error.find("byte offset " + std::to_string(cut) + ":"), std::string::npos)
        << "cut at " << cut << ": " << result.error;
  }
}

TEST(tracer_TraceFile, MissingEndRecordIsAcceptedOnlyWhenAsked) {
  const auto events = sample_events();
  const std::string bytes = encode_trace(sample_metadata(), events);
  const std::size_t header_size = bytes.size() - (events.size() + 1) * kTraceRecordBytes;
  for (std::size_t n = 0; n <= events.size(); ++n) {
    const auto cut = std::string_view(bytes).substr(0, header_size + n * kTraceRecordBytes);
    EXPECT_FALSE(parse_trace(cut).ok());
    const TraceReadResult lenient = parse_trace(cut, {.allow_missing_end = true});
    ASSERT_TRUE(lenient.ok()) << lenient.error;
    EXPECT_FALSE(lenient.trace->finished);
    EXPECT_EQ(lenient.trace->events.size(), n);
  }
  // A cut inside a record stays an error.
  EXPECT_FALSE(
      parse_trace(std::string_view(bytes).substr(0, header_size + 13), {.allow_missing_end = true})
          .ok());
}

TEST(tracer_TraceFile, EveryBitFlipIsRejected) {
  const std::string bytes = encode_trace(sample_metadata(), sample_events(), 5);
  for (std::size_t byte = 0; byte < bytes.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string corrupt = bytes;
      corrupt[byte] = static_cast<char>(corrupt[byte] ^ (1 << bit));
      const TraceReadResult result = parse_trace(corrupt);
      ASSERT_FALSE(result.ok()) << "flip of bit " << bit << " at byte " << byte;
      EXPECT_NE(result.error.find("byte offset "), std::string::npos) << result.error;
    }
  }
}

TEST(tracer_TraceFile, HeaderBitFlipNamesAPlausibleOffset) {
  const std::string bytes = encode_trace(sample_metadata(), sample_events());
  std::string corrupt = bytes;
  corrupt[50] ^= 0x10;  // inside the metadata
  const TraceReadResult result = parse_trace(corrupt);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset 32: header checksum mismatch"), std::string::npos)
      << result.error;
  corrupt = bytes;
  corrupt[3] = 'X';
  EXPECT_NE(parse_trace(corrupt).error.find("byte offset 3: not a spillway trace"),
            std::string::npos);
}

TEST(tracer_TraceFile, NewerAndInvalidVersionsAreRejectedByNumber) {
  std::string bytes = encode_trace(sample_metadata(), sample_events());
  // The next version, header CRC now stale: the version is checked first.
  bytes[8] = static_cast<char>(kTraceFormatVersion + 1);
  TraceReadResult result = parse_trace(bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset 8: trace format version " +
                              std::to_string(kTraceFormatVersion + 1) +
                              " is newer than a version this reader supports (1 to " +
                              std::to_string(kTraceFormatVersion) + ")"),
            std::string::npos)
      << result.error;
  bytes[8] = 0;
  result = parse_trace(bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("version 0 is not"), std::string::npos) << result.error;
}

TEST(tracer_TraceFile, UnknownKindIsRejected) {
  // The public encoder writes any kind, checksums included: build the event
  // with a bogus kind.
  std::vector<TraceEvent> events = sample_events();
  events[1].kind = static_cast<TraceEventKind>(19);
  const std::string bytes = encode_trace({}, events);
  const TraceReadResult result = parse_trace(bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset " + std::to_string(40 + 40 + 8) +
                              ": unknown event kind 19 for format version 4"),
            std::string::npos)
      << result.error;
}

TEST(tracer_TraceFile, MissingFileAndGarbageGiveErrorsNamingThePath) {
  TraceReadResult result = read_trace_file("/nonexistent/dir/trace.bin");
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("/nonexistent/dir/trace.bin: cannot open"), std::string::npos);

  const auto path = temp_path("garbage");
  std::ofstream(path) << "action,ptr,size\n";
  result = read_trace_file(path.string());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find(path.string() + ": byte offset 0: not a spillway trace"),
            std::string::npos)
      << result.error;
  std::filesystem::remove(path);

  std::string error;
  EXPECT_EQ(TraceFileWriter::create("/nonexistent/dir/t.bin", {}, &error), nullptr);
  EXPECT_NE(error.find("cannot create trace file '/nonexistent/dir/t.bin'"), std::string::npos);
}

// Version 2: chunk moves, stalls and steps carry detail and client.
TEST(tracer_TraceFile, Version2ChunkEventsRoundTripWithDetailAndClient) {
  std::vector<TraceEvent> events = sample_events();
  events.push_back({200, TraceEventKind::chunk_fetch, 64 << 20, 3, 1000, kTraceDetailPrefetch, 7});
  events.push_back({210, TraceEventKind::stall, 0, 3, 5000, 0, 7});
  events.push_back({220, TraceEventKind::chunk_writeback, 64 << 20, 3, 1000, 0, 7});
  events.push_back(
      {230, TraceEventKind::chunk_drop, 64 << 20, 3, 64 << 20, kTraceDetailEviction, 7});
  events.push_back({240, TraceEventKind::step, 0, 1, 0, 0, 0});
  const TraceReadResult result = parse_trace(encode_trace(sample_metadata(), events));
  ASSERT_TRUE(result.ok()) << result.error;
  expect_same_events(result.trace->events, events);
  EXPECT_EQ(result.trace->events[5].detail, kTraceDetailPrefetch);
  EXPECT_EQ(result.trace->events[5].client, 7u);
  EXPECT_EQ(result.trace->events[8].detail, kTraceDetailEviction);
}

TEST(tracer_TraceFile, AllocatorEventWithClientFieldIsCorrupt) {
  std::vector<TraceEvent> events = sample_events();
  events[2].client = 1;  // allocator events keep the field zero in every version
  const TraceReadResult result = parse_trace(encode_trace({}, events));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset " + std::to_string(40 + 2 * 40 + 10) +
                              ": reserved bytes of the record are not zero"),
            std::string::npos)
      << result.error;
}

// A version-1 file knows only the allocator's kinds: a chunk event in one is
// corrupt, not silently read.
TEST(tracer_TraceFile, Version1FileRejectsVersion2Kinds) {
  std::vector<TraceEvent> events = sample_events();
  events.push_back({200, TraceEventKind::chunk_fetch, 1024, 0, 1024});
  // Re-sealed, so only the kind is wrong.
  const std::string bytes = with_format_version(encode_trace({}, events), 1);
  const TraceReadResult result = parse_trace(bytes);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset " + std::to_string(40 + 5 * 40 + 8) +
                              ": unknown event kind 6 for format version 1"),
            std::string::npos)
      << result.error;
}

// Version 4's kinds: a spill for an allocation is an allocator event (no
// detail or client); a budget overrun is a chunk event. A version-3 file with
// either is corrupt.
TEST(tracer_TraceFile, Version4SpillAndOverrunRoundTripAndAreNotVersion3Kinds) {
  std::vector<TraceEvent> events = sample_events();
  events.push_back({200, TraceEventKind::spill_for_allocation, 0, 0x7000, 4096});
  events.push_back({210, TraceEventKind::budget_overrun, 2 << 20, 3, 1 << 20, 0, 2});
  events.push_back({220, TraceEventKind::min_budget, 0, 0, 4 << 20});
  const TraceReadResult result = parse_trace(encode_trace({}, events));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, 4u);
  ASSERT_EQ(result.trace->events.size(), events.size());
  const TraceEvent& overrun = result.trace->events[events.size() - 2];
  EXPECT_EQ(overrun.kind, TraceEventKind::budget_overrun);
  EXPECT_EQ(overrun.client, 2u);
  EXPECT_EQ(overrun.size, 1u << 20);
  EXPECT_EQ(result.trace->events.back().size, 4u << 20);

  TraceEvent spill_with_client = events[events.size() - 3];
  spill_with_client.client = 1;
  std::vector<TraceEvent> corrupt = sample_events();
  corrupt.push_back(spill_with_client);
  EXPECT_NE(parse_trace(encode_trace({}, corrupt)).error.find("reserved bytes"), std::string::npos);

  const TraceReadResult v3 = parse_trace(with_format_version(encode_trace({}, events), 3));
  ASSERT_FALSE(v3.ok());
  EXPECT_NE(v3.error.find("unknown event kind 16 for format version 3"), std::string::npos)
      << v3.error;
}

TEST(tracer_TraceFile, ShippedVersion1FileStillReads) {
  const TraceReadResult result = read_trace_file(SPILLWAY_TEST_DATA_DIR "/tiny_v1.trace");
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, 1u);
  EXPECT_FALSE(result.trace->events.empty());
  EXPECT_TRUE(result.trace->op_names.empty());
}

TEST(tracer_TraceFile, ShippedVersion2FileStillReads) {
  const TraceReadResult result = read_trace_file(SPILLWAY_TEST_DATA_DIR "/train_demo_v2.trace");
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, 2u);
  bool has_chunk_event = false;
  for (const TraceEvent& e : result.trace->events)
    has_chunk_event = has_chunk_event || e.kind == TraceEventKind::chunk_fetch;
  EXPECT_TRUE(has_chunk_event);
  EXPECT_TRUE(result.trace->op_names.empty());
}

// A version-2 file written by this encoder (the version-2 writer's bytes,
// relabelled) reads with its version's meaning.
TEST(tracer_TraceFile, Version2BytesStillRead) {
  std::vector<TraceEvent> events = sample_events();
  events.push_back({200, TraceEventKind::chunk_fetch, 64 << 20, 3, 1000, kTraceDetailPrefetch, 7});
  events.push_back({240, TraceEventKind::step, 0, 1, 0, 0, 0});
  const TraceReadResult result =
      parse_trace(with_format_version(encode_trace(sample_metadata(), events), 2));
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->format_version, 2u);
  expect_same_events(result.trace->events, events);
}

}  // namespace
}  // namespace spillway
