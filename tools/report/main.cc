// spillway-report: reads a spillway trace file (docs/trace-format.md) and
// writes what it shows: a self-contained HTML page with charts (-o), a plain
// text summary (--summary), a Chrome/Perfetto trace (--chrome). See
// docs/report.md.
//
//   spillway-report run.trace -o report.html --summary --chrome run.json
//
// Exit status: 0 done; 1 the trace could not be read (the message names the
// byte offset) or an output could not be written; 2 no output asked for;
// CLI11's codes for bad flags.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/common/tool_main.h"
#include "tools/report/chrome_trace.h"
#include "tools/report/html_report.h"
#include "tools/report/report_model.h"
#include "tools/report/summary_text.h"
#include "tracer/trace_file.h"

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    std::fprintf(stderr, "spillway-report: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

namespace {

int tool_main(int argc, char** argv) {
  CLI::App app{
      "Reads a spillway trace file and reports device memory (model and non-model bytes), chunk "
      "residency, copy traffic and stalls, as an HTML page, a text summary or a Chrome trace."};
  std::string trace_path;
  std::string html_path;
  std::string chrome_path;
  bool summary = false;
  app.add_option("TRACE", trace_path, "spillway trace file (the `trace` option's output)")
      ->required();
  app.add_option("-o,--output", html_path, "write the HTML report (one self-contained file)");
  app.add_flag("--summary", summary, "print the text summary on stdout");
  app.add_option("--chrome", chrome_path,
                 "write Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev)");
  CLI11_PARSE(app, argc, argv);
  if (html_path.empty() && chrome_path.empty() && !summary) {
    std::fprintf(stderr,
                 "spillway-report: nothing to do: give -o report.html, --summary or --chrome "
                 "out.json (see --help)\n");
    return 2;
  }

  const spillway::TraceReadResult read = spillway::read_trace_file(trace_path);
  if (!read.ok()) {
    std::fprintf(stderr, "spillway-report: %s\n", read.error.c_str());
    return 1;
  }
  const spillway::TraceFileContents& trace = *read.trace;
  const spillway::report::ReportModel model = spillway::report::build_report_model(trace);
  const std::string trace_name = std::filesystem::path(trace_path).filename().string();

  if (!html_path.empty() &&
      !write_file(html_path, spillway::report::html_report(model, trace_name))) {
    return 1;
  }
  if (!chrome_path.empty()) {
    // Metadata comes from the trace file and may hold bytes that are not
    // UTF-8; replace them rather than fail.
    const std::string json = spillway::report::chrome_trace(trace, model)
                                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (!write_file(chrome_path, json + "\n")) return 1;
  }
  if (summary) fmt::print("{}", spillway::report::summary_text(model, trace_name));
  return 0;
}

}  // namespace

// Note [A tool fails out loud] (tools/common/tool_main.h).
int main(int argc, char** argv) {
  return spillway::run_tool("spillway-report", [&] { return tool_main(argc, argv); });
}
