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

TEST(ChromeTrace, DemoTraceIsValid) {
  const TraceFileContents trace = testing::demo_v2_trace();
  testing::expect_valid_chrome_trace(chrome_trace(trace, build_report_model(trace)));
}

}  // namespace
}  // namespace spillway::report
