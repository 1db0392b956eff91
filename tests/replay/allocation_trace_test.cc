// Loading allocation traces: CSV (with and without header, errors by line)
// and binary trace files (including the ones tools/tracegen writes from the
// documented format alone).
#include "tools/replay/allocation_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tracer/op_name_records.h"

namespace spillway {
namespace {

using Kind = AllocationEvent::Kind;

TEST(replay_Csv, ReadsTheDocumentedColumns) {
  const auto result = parse_allocation_csv(
      "action,ptr,size,stream,time_ns\n"
      "alloc,0x7f00,4096,0,100\n"
      "# a comment\n"
      "\n"
      "free,0x7f00,4096,0,200\r\n"
      "alloc, 12 , 512 , 0x10 , 300\n",
      "t.csv");
  ASSERT_TRUE(result.ok()) << result.error;
  const auto& events = result.trace.events;
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, Kind::alloc);
  EXPECT_EQ(events[0].address, 0x7f00u);
  EXPECT_EQ(events[0].size, 4096u);
  EXPECT_EQ(events[0].time_ns, 100u);
  EXPECT_EQ(events[0].location, 2u);
  EXPECT_EQ(events[1].kind, Kind::free);
  EXPECT_EQ(events[1].location, 5u);
  EXPECT_EQ(events[2].address, 12u);
  EXPECT_EQ(events[2].stream, 16u);
  EXPECT_EQ(result.trace.where(events[1]), "line 5");
}

TEST(replay_Csv, LinesEndAtLfCrlfOrALoneCr) {
  for (const char* text : {"alloc,0x1,10\nfree,0x1,10\n", "alloc,0x1,10\r\nfree,0x1,10\r\n",
                           "alloc,0x1,10\rfree,0x1,10\r"}) {
    const auto result = parse_allocation_csv(text, "t.csv");
    ASSERT_TRUE(result.ok()) << result.error;
    EXPECT_EQ(result.trace.events.size(), 2u) << text;
  }
  // A bad second line is line 2 whatever the line ends.
  const auto bad = parse_allocation_csv("alloc,0x1,10\rfrob,0x1,10\r", "t.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error.find("t.csv:2:"), std::string::npos) << bad.error;
}

TEST(replay_Csv, AByteOrderMarkIsNotPartOfTheHeader) {
  const auto result = parse_allocation_csv(
      "\xEF\xBB\xBF"
      "action,ptr,size\nalloc,0x1,10\n",
      "t.csv");
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace.events.size(), 1u);
}

TEST(replay_Csv, EmptyCacheNeedsNoPtrOrSize) {
  const auto result =
      parse_allocation_csv("alloc,0x1,10\nempty_cache,,,,50\nempty_cache\n", "t.csv");
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.trace.events.size(), 3u);
  EXPECT_EQ(result.trace.events[1].kind, Kind::release_cache);
  EXPECT_EQ(result.trace.events[1].time_ns, 50u);
  EXPECT_EQ(result.trace.events[2].kind, Kind::release_cache);
}

TEST(replay_Csv, HeaderIsOptionalAndMayReorderColumns) {
  auto result = parse_allocation_csv("alloc,0x10,100\nfree,0x10\n", "t.csv");
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.trace.events.size(), 2u);
  EXPECT_EQ(result.trace.events[1].size, 0u);

  result = parse_allocation_csv("size,action,ptr,extra\n64,alloc,0x20,x\n", "t.csv");
  ASSERT_TRUE(result.ok()) << result.error;
  ASSERT_EQ(result.trace.events.size(), 1u);
  EXPECT_EQ(result.trace.events[0].size, 64u);
  EXPECT_EQ(result.trace.events[0].address, 0x20u);
}

TEST(replay_Csv, ErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* error;
  };
  const Case cases[] = {
      {"alloc,0x1,10\nmalloc,0x2,10\n", "t.csv:2: unknown action 'malloc'"},
      {"alloc,zz,10\n", "t.csv:1: bad ptr 'zz'"},
      {"\n\nalloc,0x1\n", "t.csv:3: alloc without a size"},
      {"alloc,0x1,-5\n", "t.csv:1: bad size '-5'"},
      {"alloc,0x1,5,s\n", "t.csv:1: bad stream 's'"},
      {"alloc,0x1,5,0,soon\n", "t.csv:1: bad time_ns 'soon'"},
      {"action,ptr\n", "t.csv:1: the header has no 'size' column"},
      {"action,ptr,size,size\n", "t.csv:1: column 'size' appears twice"},
  };
  for (const Case& c : cases) {
    const auto result = parse_allocation_csv(c.text, "t.csv");
    ASSERT_FALSE(result.ok()) << c.text;
    EXPECT_NE(result.error.find(c.error), std::string::npos) << result.error;
  }
}

TEST(replay_BinaryTrace, EventsKeepTheirOffsetsAndSegmentsGiveTheRecordedPeak) {
  const std::vector<TraceEvent> events = {
      {1, TraceEventKind::segment_alloc, 0, 0x1000, 2 << 20},
      {2, TraceEventKind::alloc, 0, 0x1000, 700},
      {3, TraceEventKind::segment_alloc, 0, 0x900000, 8 << 20},
      {4, TraceEventKind::segment_free, 0, 0x900000, 8 << 20},
      {5, TraceEventKind::oom, 0, 0, 1 << 30},
      {6, TraceEventKind::free, 0, 0x1000, 700},
  };
  const std::string bytes = encode_trace({}, events);
  const TraceReadResult read = parse_trace(bytes);
  ASSERT_TRUE(read.ok()) << read.error;
  const AllocationTrace trace = allocation_trace_from(*read.trace);
  ASSERT_EQ(trace.events.size(), 2u);
  EXPECT_EQ(trace.events[0].location, 40u + 40u);
  EXPECT_EQ(trace.events[1].location, 40u + 5 * 40u);
  EXPECT_EQ(trace.where(trace.events[1]), "byte offset 240");
  EXPECT_EQ(trace.recorded_peak_reserved_bytes, (2u << 20) + (8u << 20));
  EXPECT_EQ(trace.recorded_ooms, 1u);
}

// Version 3's op and chunk-use records are skipped; the allocations keep
// their offsets.
TEST(replay_BinaryTrace, Version3OpEventsAreIgnored) {
  std::vector<TraceEvent> events = op_name_records(1, "aten::linear", 1);  // records 0, 1
  events.push_back({2, TraceEventKind::op_begin, 9, 1, 0, 0, 1});
  events.push_back({3, TraceEventKind::alloc, 0, 0x1000, 700});  // record 3
  events.push_back({4, TraceEventKind::chunk_access, 1024, 0, 5, kTraceDetailRead, 0});
  events.push_back({5, TraceEventKind::chunk_release, 1024, 0, 5, 0, 0});
  events.push_back({6, TraceEventKind::free, 0, 0x1000, 700});  // record 6
  events.push_back({7, TraceEventKind::op_end, 9, 1, 5, 0, 1});
  const TraceReadResult read = parse_trace(encode_trace({}, events));
  ASSERT_TRUE(read.ok()) << read.error;
  const AllocationTrace trace = allocation_trace_from(*read.trace);
  ASSERT_EQ(trace.events.size(), 2u);
  EXPECT_EQ(trace.events[0].kind, Kind::alloc);
  EXPECT_EQ(trace.events[0].location, 40u + 3 * 40u);
  EXPECT_EQ(trace.events[1].kind, Kind::free);
  EXPECT_EQ(trace.events[1].location, 40u + 6 * 40u);
}

TEST(replay_BinaryTrace, ReadsTheTraceThatTheGeneratorWroteFromTheSpec) {
  const auto result = load_allocation_trace(SPILLWAY_TEST_DATA_DIR "/tiny_v1.trace");
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace.format, AllocationTrace::Format::binary);
  EXPECT_EQ(find_metadata(result.trace.metadata, "writer"), "tools/tracegen/make_traces.py");
  EXPECT_EQ(result.trace.events.size(), 636u);
}

TEST(replay_BinaryTrace, TruncatedFileIsRejectedWithTheOffset) {
  const auto result = load_allocation_trace(SPILLWAY_TEST_DATA_DIR "/truncated_v1.trace");
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("truncated_v1.trace: byte offset 25591: file ends inside the record"),
            std::string::npos)
      << result.error;
}

TEST(replay_Load, ChoosesTheFormatByContentAndReportsBinaryGarbage) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto csv = dir / ("spillway_replay_" + std::to_string(::getpid()) + ".trace");
  std::ofstream(csv) << "alloc,0x1,10\nfree,0x1,10\n";
  auto result = load_allocation_trace(csv.string());
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace.format, AllocationTrace::Format::csv);

  std::ofstream(csv, std::ios::binary) << std::string("ELF\0\0\x01", 6);
  result = load_allocation_trace(csv.string());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("byte offset 3: not a spillway trace"), std::string::npos)
      << result.error;
  std::filesystem::remove(csv);

  // PROTO with a version this reader does not take: the pickle reader's error.
  std::ofstream(csv, std::ios::binary) << std::string("\x80\x06}.", 4);
  result = load_allocation_trace(csv.string());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("protocol 6 (this reader takes 2 to 5)"), std::string::npos)
      << result.error;
  // A snapshot pickled with protocol 0 ("(dp0\n...") or 1 ("}q\x00..."):
  // named as such, not read as CSV lines.
  for (const std::string old_pickle :
       {std::string("(dp0\nVsegments\np1\n(lp2\ns."), std::string("}q\0X\1\0\0\0aq\1]q\2s.", 16)}) {
    std::ofstream(csv, std::ios::binary) << old_pickle;
    result = load_allocation_trace(csv.string());
    ASSERT_FALSE(result.ok());
    EXPECT_NE(result.error.find("a pickle of protocol 0 or 1"), std::string::npos) << result.error;
  }
  std::filesystem::remove(csv);

  std::ofstream(csv, std::ios::trunc);  // empty: an error, not a trace of nothing
  result = load_allocation_trace(csv.string());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("empty file"), std::string::npos) << result.error;
  std::filesystem::remove(csv);
  result = load_allocation_trace(dir.string());
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("is a directory"), std::string::npos) << result.error;

  result = load_allocation_trace("/nonexistent/x.csv");
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("/nonexistent/x.csv: cannot open"), std::string::npos);
}

}  // namespace
}  // namespace spillway
