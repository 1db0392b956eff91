// The HTML report (`spillway-report -o report.html`): one self-contained page
// with inline CSS and SVG charts, no scripts and no network references, so it
// opens offline and can be attached to a bug report as one file.
//
// Charts: device memory over time (model and non-model bytes stacked, reserved
// line, budget rule, step marks); chunk residency per client; host-to-device
// and device-to-host traffic per time bucket; stall time per time bucket.
// Then the summary tables, the trace's metadata and the recommendations.
// Traces without chunk events (format version 1) get a sentence instead of
// the three chunk charts.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "tools/report/report_model.h"

namespace spillway::report {

struct HtmlReportOptions {
  std::size_t max_points_per_series = 2000;  // see sample_selection.h
  std::size_t time_buckets = 100;            // traffic and stall charts
};

std::string html_report(const ReportModel& model, std::string_view trace_name,
                        const HtmlReportOptions& options = {});

}  // namespace spillway::report
