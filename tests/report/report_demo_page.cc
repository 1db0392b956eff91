// Writes the HTML report of testing::demo_v2_trace() to argv[1]: a page with
// every chart, for the browser test and the screenshot in docs/report.md.
#include <cstdio>
#include <fstream>

#include "tests/report/synthetic_traces.h"
#include "tools/report/html_report.h"
#include "tools/report/report_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: report_demo_page OUT.html\n");
    return 2;
  }
  const spillway::report::ReportModel model =
      spillway::report::build_report_model(spillway::report::testing::demo_v2_trace());
  std::ofstream file(argv[1], std::ios::binary | std::ios::trunc);
  file << spillway::report::html_report(model, "demo (synthetic, format version 2)");
  return file ? 0 : 1;
}
