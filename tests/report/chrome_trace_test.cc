#include "tools/report/chrome_trace.h"

#include <gtest/gtest.h>

#include "tests/report/chrome_trace_validation.h"
#include "tests/report/synthetic_traces.h"

namespace spillway::report {
namespace {

using nlohmann::json;

std::size_t count_events(const json& document, std::string_view ph, std::string_view name_prefix) {
  std::size_t count = 0;
  for (const json& event : document["traceEvents"]) {
    if (event["ph"] == ph && event["name"].get<std::string>().starts_with(name_prefix)) ++count;
  }
  return count;
}

TEST(ChromeTrace, SmallV2TraceEvents) {
  const TraceFileContents trace = testing::small_v2_trace();
  const json document = chrome_trace(trace, build_report_model(trace));
  testing::expect_valid_chrome_trace(document);
  EXPECT_EQ(count_events(document, "X", "stall"), 2u);
  EXPECT_EQ(count_events(document, "i", "step"), 2u);
  EXPECT_EQ(count_events(document, "i", "out of memory"), 1u);
  EXPECT_EQ(count_events(document, "i", "fetch chunk"), 3u);
  EXPECT_EQ(count_events(document, "i", "prefetch chunk"), 1u);
  EXPECT_EQ(count_events(document, "i", "writeback chunk"), 1u);
  EXPECT_EQ(count_events(document, "i", "evict chunk"), 1u);
  EXPECT_EQ(count_events(document, "M", "thread_name"), 3u);  // allocator, client 0, client 1
  // The 50 ns stall on client 1 ended 400 ns after the first event.
  for (const json& event : document["traceEvents"]) {
    if (event["ph"] == "X" && event["tid"] == 2) {
      EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 0.35);
      EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 0.05);
    }
  }
  EXPECT_EQ(document["metadata"]["device_budget_bytes"], "1000000");
}

TEST(ChromeTrace, ARepeatedMetadataKeyKeepsEveryValueInFileOrder) {
  TraceFileContents trace = testing::small_v2_trace();
  trace.metadata.emplace_back("note", "first");
  trace.metadata.emplace_back("note", "second");
  trace.metadata.emplace_back("note", "third");
  const json document = chrome_trace(trace, build_report_model(trace));
  EXPECT_EQ(document["metadata"]["note"], json::array({"first", "second", "third"}));
  EXPECT_EQ(document["metadata"]["device_budget_bytes"], "1000000");  // once: a string
}

TEST(ChromeTrace, CountersFollowTheModel) {
  const TraceFileContents trace = testing::small_v2_trace();
  const json document = chrome_trace(trace, build_report_model(trace));
  std::uint64_t peak_allocated = 0, peak_model = 0;
  for (const json& event : document["traceEvents"]) {
    if (event["ph"] != "C") continue;
    const std::uint64_t bytes = event["args"]["bytes"];
    if (event["name"] == "allocated") peak_allocated = std::max(peak_allocated, bytes);
    if (event["name"] == "model") peak_model = std::max(peak_model, bytes);
  }
  EXPECT_EQ(peak_allocated, 3584u);
  EXPECT_EQ(peak_model, 3072u);
}

TEST(ChromeTrace, StallStartingBeforeTheTraceIsCut) {
  TraceFileContents trace;
  trace.format_version = 2;
  trace.events = {{1000, TraceEventKind::stall, 0, 4, 5000, 0, 3}};
  const json document = chrome_trace(trace, build_report_model(trace));
  testing::expect_valid_chrome_trace(document);
  EXPECT_EQ(count_events(document, "X", "stall on chunk 4"), 1u);
}

// Version 3: each op is a complete event named from its op_name records,
// on a row per thread of an "ops" process, nested ops inside their parent.
TEST(ChromeTrace, OpsAreSpansOnTheirThreadsRows) {
  TraceFileContents trace;
  trace.format_version = 3;
  trace.op_names = {{1, "aten::linear"}, {2, "aten::addmm"}};
  auto op = [](std::uint64_t time_ns, TraceEventKind kind, std::uint32_t name, std::uint64_t thread,
               std::uint64_t sequence, std::uint64_t size) {
    TraceEvent event;
    event.time_ns = time_ns;
    event.kind = kind;
    event.client = name;
    event.stream = thread;
    event.address = sequence;
    event.size = size;
    return event;
  };
  trace.events = {op(1000, TraceEventKind::op_begin, 1, 77, 1, 0),
                  op(1100, TraceEventKind::op_begin, 2, 77, 2, 1),
                  op(1400, TraceEventKind::op_end, 2, 77, 2, 300),
                  op(1500, TraceEventKind::op_end, 1, 77, 1, 500),
                  op(1600, TraceEventKind::op_begin, 2, 99, 3, 0),
                  op(1700, TraceEventKind::op_end, 2, 99, 3, 100)};
  const json document = chrome_trace(trace, build_report_model(trace));
  testing::expect_valid_chrome_trace(document);
  EXPECT_EQ(count_events(document, "X", "aten::linear"), 1u);
  EXPECT_EQ(count_events(document, "X", "aten::addmm"), 2u);
  EXPECT_EQ(count_events(document, "M", "process_name"), 2u);  // spillway, ops
  for (const json& event : document["traceEvents"]) {
    if (event["ph"] != "X") continue;
    EXPECT_EQ(event["pid"], 2);
    if (event["args"]["sequence"] == 1) {  // the outer op: 0 to 0.5 us on the first row
      EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 0.0);
      EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 0.5);
      EXPECT_EQ(event["tid"], 0);
    }
    if (event["args"]["sequence"] == 2) {  // inside it
      EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 0.1);
      EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 0.3);
      EXPECT_EQ(event["tid"], 0);
    }
    if (event["args"]["sequence"] == 3) EXPECT_EQ(event["tid"], 1);  // another thread's row
  }
}

TEST(ChromeTrace, DemoTraceIsValid) {
  const TraceFileContents trace = testing::demo_v2_trace();
  testing::expect_valid_chrome_trace(chrome_trace(trace, build_report_model(trace)));
}

}  // namespace
}  // namespace spillway::report
