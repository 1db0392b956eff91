#include "tools/report/html_report.h"

#include <fmt/format.h>

#include <iterator>

#include "tools/report/recommendations.h"
#include "tools/report/report_units.h"
#include "tools/report/sample_selection.h"
#include "tools/report/summary_text.h"
#include "tools/report/svg_chart.h"

namespace spillway::report {

namespace {

constexpr const char* kModelColor = "#3b6fb6";
constexpr const char* kNonModelColor = "#f0a431";
constexpr const char* kReservedColor = "#444444";
constexpr const char* kBudgetColor = "#c0392b";
constexpr const char* kH2dColor = "#2e8b57";
constexpr const char* kD2hColor = "#8e44ad";
constexpr const char* kStallColor = "#c0392b";
constexpr const char* kClientColors[] = {"#3b6fb6", "#e67e22", "#27ae60", "#8e44ad",
                                         "#c0392b", "#16a085", "#7f8c8d", "#d4ac0d"};

constexpr const char* kStyle =
    R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
svg{display:block;margin:8px 0;background:#fff}
svg .title{font-size:14px;font-weight:bold}svg .legend{font-size:12px}
svg .ylabel{font-size:11px;text-anchor:end}svg .xlabel{font-size:11px;text-anchor:middle}
svg .grid{stroke:#e4e4e4}svg .frame{fill:none;stroke:#888}
svg .mark{stroke:#999;stroke-width:0.6;stroke-dasharray:2 2}
p.none{color:#666;font-style:italic;border:1px dashed #bbb;padding:16px;width:960px})";

double relative_ns(const ReportModel& model, std::uint64_t time_ns) {
  return time_ns > model.first_time_ns ? static_cast<double>(time_ns - model.first_time_ns) : 0.0;
}

std::string memory_chart(const ReportModel& model, const HtmlReportOptions& options) {
  std::vector<std::uint64_t> times, allocated, reserved, model_bytes;
  for (const MemorySample& sample : model.memory) {
    times.push_back(sample.time_ns);
    allocated.push_back(sample.allocated_bytes);
    reserved.push_back(sample.reserved_bytes);
    model_bytes.push_back(sample.model_bytes);
  }
  ChartSpec spec;
  spec.title = "Device memory over time";
  spec.x_span = static_cast<double>(model.totals.duration_ns);
  ChartBand model_band{"model (resident chunks)", kModelColor, {}, {}, {}};
  ChartBand other_band{"non-model", kNonModelColor, {}, {}, {}};
  ChartLine reserved_line{"reserved", kReservedColor, {}, {}, false};
  for (const std::size_t i :
       select_samples(times, {allocated, reserved, model_bytes}, options.max_points_per_series)) {
    const MemorySample& sample = model.memory[i];
    const double t = relative_ns(model, sample.time_ns);
    const double model_top = static_cast<double>(sample.model_bytes);
    model_band.times.push_back(t);
    model_band.lower.push_back(0);
    model_band.upper.push_back(model_top);
    other_band.times.push_back(t);
    other_band.lower.push_back(model_top);
    other_band.upper.push_back(model_top + static_cast<double>(sample.non_model_bytes()));
    reserved_line.times.push_back(t);
    reserved_line.values.push_back(static_cast<double>(sample.reserved_bytes));
  }
  if (model.has_chunk_events) spec.bands.push_back(std::move(model_band));
  other_band.label = model.has_chunk_events ? "non-model" : "allocated";
  spec.bands.push_back(std::move(other_band));
  // A trace without segment events says nothing about reserved memory.
  if (model.totals.segment_allocs > 0) spec.lines.push_back(std::move(reserved_line));
  if (model.device_budget_bytes) {
    spec.rules.push_back(
        {"device budget", kBudgetColor, static_cast<double>(*model.device_budget_bytes)});
  }
  for (const StepMark& step : model.steps) spec.marks.push_back(relative_ns(model, step.time_ns));
  spec.marks_label = "step boundaries";
  return render_svg_chart(spec);
}

std::string residency_chart(const ReportModel& model, const HtmlReportOptions& options) {
  ChartSpec spec;
  spec.title = "Chunk residency on the device, per client";
  spec.x_span = static_cast<double>(model.totals.duration_ns);
  const std::size_t per_client = std::max<std::size_t>(
      options.max_points_per_series / std::max<std::size_t>(model.clients.size(), 1), 16);
  std::size_t color = 0;
  for (const ClientActivity& client : model.clients) {
    std::vector<std::uint64_t> times, resident;
    for (const ResidencySample& sample : client.residency) {
      times.push_back(sample.time_ns);
      resident.push_back(sample.resident_bytes);
    }
    ChartLine line{client_label(client.client),
                   kClientColors[color++ % std::size(kClientColors)],
                   {},
                   {},
                   false};
    for (const std::size_t i : select_samples(times, {resident}, per_client)) {
      line.times.push_back(relative_ns(model, times[i]));
      line.values.push_back(static_cast<double>(resident[i]));
    }
    spec.lines.push_back(std::move(line));
  }
  for (const StepMark& step : model.steps) spec.marks.push_back(relative_ns(model, step.time_ns));
  spec.marks_label = "step boundaries";
  return render_svg_chart(spec);
}

std::string traffic_chart(const std::vector<TrafficBucket>& buckets, double x_span) {
  ChartSpec spec;
  spec.title = "Chunk copies: bytes per time bucket";
  spec.x_span = x_span;
  ChartBars h2d{"host to device", kH2dColor, {}};
  ChartBars d2h{"device to host", kD2hColor, {}};
  for (const TrafficBucket& bucket : buckets) {
    h2d.values.push_back(static_cast<double>(bucket.bytes_h2d));
    d2h.values.push_back(static_cast<double>(bucket.bytes_d2h));
  }
  spec.bars = {std::move(h2d), std::move(d2h)};
  return render_svg_chart(spec);
}

std::string stall_chart(const std::vector<TrafficBucket>& buckets, double x_span) {
  ChartSpec spec;
  spec.title = "Host stalls waiting for chunk moves: time per bucket";
  spec.x_span = x_span;
  spec.unit = ChartUnit::nanoseconds;
  ChartBars stalls{"stall time", kStallColor, {}};
  for (const TrafficBucket& bucket : buckets)
    stalls.values.push_back(static_cast<double>(bucket.stall_ns));
  spec.bars = {std::move(stalls)};
  return render_svg_chart(spec);
}

void table_row(std::string* out, std::string_view name, const std::string& value) {
  fmt::format_to(std::back_inserter(*out), "<tr><th>{}</th><td class=\"n\">{}</td></tr>\n",
                 escape_html(name), escape_html(value));
}

std::string bytes_cell(std::uint64_t bytes) {
  return fmt::format("{} ({} bytes)", format_bytes(bytes), bytes);
}

std::string totals_table(const ReportModel& model) {
  const ReportTotals& t = model.totals;
  std::string out = "<table>\n";
  table_row(&out, "format version", std::to_string(model.format_version));
  table_row(&out, "events", std::to_string(t.event_count));
  table_row(&out, "duration", format_duration_ns(t.duration_ns));
  table_row(&out, "device budget",
            model.device_budget_bytes ? bytes_cell(*model.device_budget_bytes) : "not recorded");
  table_row(&out, "peak allocated", bytes_cell(t.peak_allocated_bytes));
  table_row(&out, "peak reserved",
            t.segment_allocs > 0 ? bytes_cell(t.peak_reserved_bytes)
                                 : std::string("not recorded (no segment events)"));
  table_row(&out, "peak model", bytes_cell(t.peak_model_bytes));
  table_row(&out, "peak non-model", bytes_cell(t.peak_non_model_bytes));
  table_row(&out, "model size (all chunks seen)", bytes_cell(t.model_size_bytes));
  table_row(&out, "chunk fill on the device (chunks fetched: used bytes over device copies)",
            t.fetched_chunk_capacity_bytes == 0 ? std::string("no chunk fetched")
                                                : fmt::format("{:.3f}", t.chunk_fill_ratio()));
  table_row(&out, "host to device", bytes_cell(t.bytes_h2d));
  table_row(&out, "device to host", bytes_cell(t.bytes_d2h));
  table_row(&out, "fetches (prefetches)", fmt::format("{} ({})", t.fetches, t.prefetches));
  table_row(&out, "writebacks", std::to_string(t.writebacks));
  table_row(&out, "drops (evictions)", fmt::format("{} ({})", t.drops, t.evictions));
  table_row(&out, "stalls", fmt::format("{}, {}", t.stalls, format_duration_ns(t.stall_ns)));
  if (model.format_version >= 4 && !model.steps.empty()) {
    std::string per_step;
    for (const StepMark& step : model.steps)
      per_step +=
          fmt::format("{}{} / {}", per_step.empty() ? "" : "; ", format_duration_ns(step.stall_ns),
                      format_duration_ns(step.expected_stall_ns));
    table_row(&out, "stall per step (measured / expected by the copy model)", per_step);
  }
  table_row(&out, "out-of-memories",
            t.ooms == 0 ? std::string("0")
                        : fmt::format("{} (largest failed request {})", t.ooms,
                                      format_bytes(t.largest_oom_request_bytes)));
  table_row(&out, "spills for allocations", std::to_string(t.spills_for_allocation));
  table_row(&out, "smallest budget (largest set of chunks one op needed)",
            t.min_budget_bytes == 0 ? std::string("not recorded") : bytes_cell(t.min_budget_bytes));
  table_row(&out, "budget overruns",
            t.budget_overruns == 0 ? std::string("0")
                                   : fmt::format("{} (largest {})", t.budget_overruns,
                                                 format_bytes(t.largest_overrun_bytes)));
  table_row(&out, "steps", std::to_string(t.steps));
  out += "</table>\n";
  return out;
}

std::string clients_table(const ReportModel& model) {
  std::string out =
      "<table>\n<tr><th>client</th><th>peak resident</th><th>chunks</th><th>host to device</th>"
      "<th>device to host</th><th>fetches</th><th>prefetches</th><th>writebacks</th>"
      "<th>evictions</th><th>stalls</th><th>stall time</th></tr>\n";
  for (const ClientActivity& c : model.clients) {
    fmt::format_to(std::back_inserter(out),
                   "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
                   "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
                   "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
                   "<td class=\"n\">{}</td><td class=\"n\">{}</td></tr>\n",
                   client_label(c.client), format_bytes(c.peak_resident_bytes),
                   format_bytes(c.chunk_bytes), format_bytes(c.bytes_h2d),
                   format_bytes(c.bytes_d2h), c.fetches, c.prefetches, c.writebacks, c.evictions,
                   c.stalls, format_duration_ns(c.stall_ns));
  }
  out += "</table>\n";
  return out;
}

std::string metadata_table(const ReportModel& model) {
  if (model.metadata.empty()) return "<p>The trace has no metadata.</p>\n";
  std::string out = "<table>\n";
  for (const auto& [key, value] : model.metadata) {
    fmt::format_to(std::back_inserter(out), "<tr><th>{}</th><td>{}</td></tr>\n", escape_html(key),
                   escape_html(value));
  }
  out += "</table>\n";
  return out;
}

}  // namespace

std::string html_report(const ReportModel& model, std::string_view trace_name,
                        const HtmlReportOptions& options) {
  std::string out;
  auto put = std::back_inserter(out);
  fmt::format_to(put,
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<title>spillway report: {0}</title>\n<style>\n{1}\n</style>\n</head>\n<body>\n"
                 "<h1>spillway report: {0}</h1>\n",
                 escape_html(trace_name), kStyle);
  out += "<h2>Device memory</h2>\n";
  out += memory_chart(model, options);
  out += "<h2>Chunks</h2>\n";
  if (!model.has_chunk_events) {
    fmt::format_to(put, "<p class=\"none\">no chunk events in this trace (format version {})</p>\n",
                   model.format_version);
  } else {
    const std::vector<TrafficBucket> buckets = traffic_buckets(model, options.time_buckets);
    const double x_span = static_cast<double>(model.totals.duration_ns);
    out += residency_chart(model, options);
    out += traffic_chart(buckets, x_span);
    out += stall_chart(buckets, x_span);
  }
  out += "<h2>Summary</h2>\n";
  out += totals_table(model);
  out += "<h2>Clients</h2>\n";
  if (model.clients.empty()) {
    out += "<p>No chunk-manager clients in this trace.</p>\n";
  } else {
    out += "<p>Client names are not recorded in the trace; clients are shown by id.</p>\n";
    out += clients_table(model);
  }
  out += "<h2>Recommendations</h2>\n<ul>\n";
  for (const std::string& sentence : recommendations(model)) {
    fmt::format_to(put, "<li>{}</li>\n", escape_html(sentence));
  }
  out += "</ul>\n<h2>Trace metadata</h2>\n";
  out += metadata_table(model);
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace spillway::report
