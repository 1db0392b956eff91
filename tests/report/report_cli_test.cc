// The spillway-report command line: the golden summary of a shipped trace,
// the HTML and Chrome outputs, and rejection of broken files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/report/chrome_trace_validation.h"
#include "tests/report/synthetic_traces.h"
#include "tests/tracer/trace_test_support.h"
#include "tracer/op_name_records.h"
#include "tracer/trace_file.h"

namespace {

namespace fs = std::filesystem;

const fs::path kDataDir = SPILLWAY_TEST_DATA_DIR;
const fs::path kGoldenDir = SPILLWAY_REPORT_GOLDEN_DIR;
const fs::path kWorkDir = SPILLWAY_REPORT_WORK_DIR;

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs spillway-report with `args` (already shell-quoted where needed).
RunResult run_report(const std::string& name, const std::string& args) {
  const fs::path dir = kWorkDir / "cli" / name;
  fs::create_directories(dir);
  const std::string command = "'" SPILLWAY_REPORT_PROGRAM "' " + args + " >'" +
                              (dir / "stdout").string() + "' 2>'" + (dir / "stderr").string() + "'";
  const int status = std::system(command.c_str());
  RunResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_file(dir / "stdout");
  result.err = read_file(dir / "stderr");
  return result;
}

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

// Recorded traces: the allocator-only tiny_v1, and three steps of the
// training demo with spillway's Adam (format version 2, chunk events).
TEST(ReportCli, SummaryMatchesGolden) {
  for (const std::string name : {"tiny_v1", "train_demo_v2"}) {
    const RunResult run =
        run_report("golden_" + name, quoted(kDataDir / (name + ".trace")) + " --summary");
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out, read_file(kGoldenDir / (name + ".summary.txt")))
        << "regenerate with: spillway-report tests/data/" << name
        << ".trace --summary > tests/report/golden/" << name
        << ".summary.txt (and check the numbers)";
  }
}

TEST(ReportCli, WritesHtmlAndChromeTrace) {
  const fs::path dir = kWorkDir / "cli" / "outputs";
  fs::create_directories(dir);
  const RunResult run = run_report("outputs", quoted(kDataDir / "tiny_v1.trace") + " -o " +
                                                  quoted(dir / "report.html") + " --chrome " +
                                                  quoted(dir / "trace.json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_TRUE(run.out.empty());  // no --summary
  const std::string html = read_file(dir / "report.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("no chunk events in this trace (format version 1)"), std::string::npos);
  const nlohmann::json document = nlohmann::json::parse(read_file(dir / "trace.json"));
  spillway::report::testing::expect_valid_chrome_trace(document);
  EXPECT_GT(document["traceEvents"].size(), 600u);  // a counter per alloc and free, at least
}

// A version 2 file written by the trace encoder, read back by the tool:
// chunk charts, clients and the Chrome trace's client rows.
TEST(ReportCli, VersionTwoFile) {
  if (spillway::kTraceFormatVersion < 2) {
    GTEST_SKIP() << "the trace writer does not write version 2 yet";
  }
  const spillway::TraceFileContents demo = spillway::report::testing::demo_v2_trace();
  const fs::path dir = kWorkDir / "cli" / "v2";
  fs::create_directories(dir);
  std::ofstream(dir / "demo.trace", std::ios::binary) << spillway::testing::with_format_version(
      spillway::encode_trace(demo.metadata, demo.events), 2);
  const RunResult run =
      run_report("v2", quoted(dir / "demo.trace") + " --summary -o " + quoted(dir / "report.html") +
                           " --chrome " + quoted(dir / "trace.json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("format version: 2"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("  client 2: peak resident"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("steps: 6"), std::string::npos) << run.out;
  const std::string html = read_file(dir / "report.html");
  EXPECT_NE(html.find("Chunk residency on the device, per client"), std::string::npos);
  EXPECT_EQ(html.find("no chunk events"), std::string::npos);
  const nlohmann::json document = nlohmann::json::parse(read_file(dir / "trace.json"));
  spillway::report::testing::expect_valid_chrome_trace(document);
}

// Version 3: ops are counted per step in the summary; the other outputs
// accept the file.
TEST(ReportCli, VersionThreeFileCountsOpsPerStep) {
  using spillway::TraceEvent;
  using K = spillway::TraceEventKind;
  std::vector<TraceEvent> events = spillway::op_name_records(1, "aten::addmm", 10);
  std::uint64_t time = 10, sequence = 0;
  auto op = [&] {
    ++sequence;
    events.push_back({time += 10, K::op_begin, 7, sequence, 0, 0, 1});
    events.push_back({time += 10, K::chunk_access, 1024, 0, 3, spillway::kTraceDetailRead, 0});
    events.push_back({time += 10, K::chunk_release, 1024, 0, 3, 0, 0});
    events.push_back({time += 10, K::op_end, 7, sequence, 30, 0, 1});
  };
  op(), op(), op();
  events.push_back({time += 10, K::step, 0, 1, 0});
  op(), op();
  events.push_back({time += 10, K::step, 0, 2, 0});
  op();
  const fs::path dir = kWorkDir / "cli" / "v3";
  fs::create_directories(dir);
  std::ofstream(dir / "ops.trace", std::ios::binary) << spillway::encode_trace({}, events);
  const RunResult run =
      run_report("v3", quoted(dir / "ops.trace") + " --summary -o " + quoted(dir / "report.html") +
                           " --chrome " + quoted(dir / "trace.json"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("format version: " + std::to_string(spillway::kTraceFormatVersion)),
            std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("ops: 6 traced (1 distinct names), 6 chunk accesses"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("ops per step: 3, 2 (+1 after the last step)"), std::string::npos)
      << run.out;
  const nlohmann::json document = nlohmann::json::parse(read_file(dir / "trace.json"));
  spillway::report::testing::expect_valid_chrome_trace(document);
}

TEST(ReportCli, NoOutputIsAUsageError) {
  const RunResult run = run_report("no_output", quoted(kDataDir / "tiny_v1.trace"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("give -o report.html, --summary or --chrome"), std::string::npos)
      << run.err;
}

TEST(ReportCli, RejectsTruncatedTrace) {
  const RunResult run =
      run_report("truncated", quoted(kDataDir / "truncated_v1.trace") + " --summary");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("byte offset"), std::string::npos) << run.err;
  EXPECT_TRUE(run.out.empty());
}

TEST(ReportCli, RejectsCorruptTrace) {
  std::string bytes = read_file(kDataDir / "tiny_v1.trace");
  ASSERT_GT(bytes.size(), 1000u);
  // One flipped bit in an event record's size: only the records CRC notices.
  bytes[bytes.size() / 2] ^= 0x10;
  const fs::path corrupt = kWorkDir / "cli" / "corrupt_tiny_v1.trace";
  fs::create_directories(corrupt.parent_path());
  std::ofstream(corrupt, std::ios::binary) << bytes;
  const RunResult run = run_report(
      "corrupt", quoted(corrupt) + " --summary -o " + quoted(kWorkDir / "cli" / "corrupt.html"));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("byte offset"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(kWorkDir / "cli" / "corrupt.html"));
}

TEST(ReportCli, MissingFile) {
  const RunResult run = run_report("missing", quoted(kDataDir / "no_such.trace") + " --summary");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("no_such.trace"), std::string::npos) << run.err;
}

}  // namespace
