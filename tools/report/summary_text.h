// The plain-text summary (`spillway-report --summary`): totals, one line per
// client, recommendations. Deterministic (no wall clock, no paths beyond the
// name given), so tests compare it with golden files.
#pragma once

#include <string>
#include <string_view>

#include "tools/report/report_model.h"

namespace spillway::report {

// `trace_name`: how the trace is named in the first line (spillway-report
// passes the file name without its directories).
std::string summary_text(const ReportModel& model, std::string_view trace_name);

// "client 3": client names are not in the trace.
std::string client_label(std::uint32_t client);

}  // namespace spillway::report
