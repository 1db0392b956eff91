// The HTML page: self-contained (no network references), charts present,
// trace text escaped, long traces downsampled.
#include "tools/report/html_report.h"

#include <gtest/gtest.h>

#include "tests/report/synthetic_traces.h"

namespace spillway::report {
namespace {

std::size_t count_of(const std::string& text, std::string_view needle) {
  std::size_t count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

// Every "http" in the page must be the SVG namespace, which names and does not fetch.
void expect_no_network_references(std::string html) {
  constexpr std::string_view kSvgNamespace = "http://www.w3.org/2000/svg";
  for (std::size_t at = html.find(kSvgNamespace); at != std::string::npos;
       at = html.find(kSvgNamespace)) {
    html.erase(at, kSvgNamespace.size());
  }
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
}

TEST(HtmlReport, VersionTwoHasFourChartsAndTables) {
  const ReportModel model = build_report_model(testing::demo_v2_trace());
  const std::string html = html_report(model, "demo.trace");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count_of(html, "<svg"), 4u);
  EXPECT_EQ(count_of(html, "</svg>"), 4u);
  EXPECT_NE(html.find("Device memory over time"), std::string::npos);
  EXPECT_NE(html.find("client 2"), std::string::npos);
  EXPECT_NE(html.find("device budget"), std::string::npos);
  EXPECT_EQ(html.find("no chunk events"), std::string::npos);
  expect_no_network_references(html);
}

TEST(HtmlReport, VersionOneSaysThereAreNoChunkEvents) {
  TraceFileContents trace;
  trace.format_version = 1;
  trace.events = {{10, TraceEventKind::alloc, 0, 0x1000, 100},
                  {20, TraceEventKind::free, 0, 0x1000, 100}};
  const std::string html = html_report(build_report_model(trace), "v1.trace");
  EXPECT_EQ(count_of(html, "<svg"), 1u);
  EXPECT_NE(html.find("no chunk events in this trace (format version 1)"), std::string::npos);
  expect_no_network_references(html);
}

TEST(HtmlReport, EscapesTraceText) {
  TraceFileContents trace = testing::small_v2_trace();
  trace.metadata.push_back({"model", "<script>alert('x')</script> & \"more\""});
  trace.metadata.push_back({"<b>key</b>", "https://example.com/x"});
  const std::string html = html_report(build_report_model(trace), "<i>name</i>.trace");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>key"), std::string::npos);
  EXPECT_EQ(html.find("<i>name"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;more&quot;"),
            std::string::npos);
  EXPECT_NE(html.find("&lt;i&gt;name&lt;/i&gt;.trace"), std::string::npos);
}

TEST(HtmlReport, LongTracesAreDownsampled) {
  TraceFileContents trace;
  trace.format_version = 1;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    trace.events.push_back({i * 100, TraceEventKind::alloc, 0, 0x1000 + i, 1000 + i % 4096});
    trace.events.push_back({i * 100 + 50, TraceEventKind::free, 0, 0x1000 + i, 1000 + i % 4096});
  }
  const std::string html = html_report(build_report_model(trace), "long.trace");
  // 400000 samples become at most 2000 points, each drawn as two corners
  // of a step of about 14 bytes: well under a megabyte.
  EXPECT_LT(html.size(), 400'000u);
}

}  // namespace
}  // namespace spillway::report
