#include "tools/report/summary_text.h"

#include <fmt/format.h>

#include <iterator>

#include "tools/report/recommendations.h"
#include "tools/report/report_units.h"

namespace spillway::report {

namespace {

std::string bytes_with_exact(std::uint64_t bytes) {
  return fmt::format("{} ({} bytes)", format_bytes(bytes), bytes);
}

std::string metadata_or(const ReportModel& model, std::string_view key, std::string_view fallback) {
  const std::optional<std::string> value = find_metadata(model.metadata, key);
  return value ? *value : std::string(fallback);
}

}  // namespace

std::string client_label(std::uint32_t client) { return fmt::format("client {}", client); }

std::string summary_text(const ReportModel& model, std::string_view trace_name) {
  const ReportTotals& t = model.totals;
  std::string out;
  auto line = std::back_inserter(out);
  fmt::format_to(line, "spillway report: {}\n", trace_name);
  fmt::format_to(line, "format version: {}\n", model.format_version);
  fmt::format_to(line, "events: {} ({} allocs, {} frees)\n", t.event_count, t.allocs, t.frees);
  fmt::format_to(line, "duration: {} ({} ns)\n", format_duration_ns(t.duration_ns), t.duration_ns);
  fmt::format_to(line, "device: {}\n", metadata_or(model, "device", "not recorded"));
  fmt::format_to(line, "device budget: {}\n",
                 model.device_budget_bytes ? bytes_with_exact(*model.device_budget_bytes)
                                           : std::string("not recorded"));
  fmt::format_to(line, "chunk size: {}\n",
                 model.chunk_size_bytes ? bytes_with_exact(*model.chunk_size_bytes)
                                        : std::string("not recorded"));
  out += "\n";
  fmt::format_to(line, "peak allocated: {}\n", bytes_with_exact(t.peak_allocated_bytes));
  fmt::format_to(line, "peak reserved: {}\n",
                 t.segment_allocs > 0 ? bytes_with_exact(t.peak_reserved_bytes)
                                      : std::string("not recorded (no segment events)"));
  fmt::format_to(line, "peak model: {}\n", bytes_with_exact(t.peak_model_bytes));
  fmt::format_to(line, "peak non-model: {}\n", bytes_with_exact(t.peak_non_model_bytes));
  fmt::format_to(line, "model size (all chunks seen): {}\n", bytes_with_exact(t.model_size_bytes));
  if (t.fetched_chunk_capacity_bytes > 0) {
    fmt::format_to(
        line, "chunk fill on the device (chunks fetched: used bytes over device copies): {:.3f}\n",
        t.chunk_fill_ratio());
  }
  fmt::format_to(line, "host to device: {}\n", bytes_with_exact(t.bytes_h2d));
  fmt::format_to(line, "device to host: {}\n", bytes_with_exact(t.bytes_d2h));
  fmt::format_to(line, "fetches: {} ({} prefetches), writebacks: {}, drops: {} ({} evictions)\n",
                 t.fetches, t.prefetches, t.writebacks, t.drops, t.evictions);
  fmt::format_to(line, "stalls: {}, {} ({} ns)\n", t.stalls, format_duration_ns(t.stall_ns),
                 t.stall_ns);
  if (t.ooms > 0) {
    fmt::format_to(line, "out-of-memories: {} (largest failed request {})\n", t.ooms,
                   bytes_with_exact(t.largest_oom_request_bytes));
  } else {
    out += "out-of-memories: 0\n";
  }
  fmt::format_to(line, "spills for allocations: {}\n", t.spills_for_allocation);
  if (t.min_budget_bytes > 0) {
    fmt::format_to(line, "smallest budget (largest set of chunks one op needed): {}\n",
                   bytes_with_exact(t.min_budget_bytes));
  }
  if (t.budget_overruns > 0) {
    fmt::format_to(line, "budget overruns: {} (largest {})\n", t.budget_overruns,
                   bytes_with_exact(t.largest_overrun_bytes));
  }
  fmt::format_to(line, "steps: {}\n", t.steps);
  if (t.ops > 0) {  // version 3 traces
    std::string per_step;
    for (const StepMark& step : model.steps)
      per_step += fmt::format("{}{}", per_step.empty() ? "" : ", ", step.ops);
    fmt::format_to(line, "ops: {} traced ({} distinct names), {} chunk accesses\n", t.ops,
                   model.op_name_count, t.chunk_accesses);
    fmt::format_to(line, "ops per step: {}{}\n", per_step.empty() ? "no step marks" : per_step,
                   t.ops_after_steps > 0
                       ? fmt::format(" (+{} after the last step)", t.ops_after_steps)
                       : std::string());
  }
  if (model.format_version >= 4 && !model.steps.empty()) {
    std::string per_step;
    for (const StepMark& step : model.steps)
      per_step += fmt::format("{}{:.3f}/{:.3f}", per_step.empty() ? "" : ", ", step.stall_ns / 1e6,
                              step.expected_stall_ns / 1e6);
    fmt::format_to(line, "stall per step (ms, measured/expected by the copy model): {}\n",
                   per_step);
  }
  if (t.unmatched_frees > 0) {
    fmt::format_to(line, "note: {} frees had no matching live bytes (trace started mid-run?)\n",
                   t.unmatched_frees);
  }
  out += "\nclients:\n";
  if (model.clients.empty()) {
    fmt::format_to(line, "  none: no chunk events in this trace (format version {})\n",
                   model.format_version);
  }
  for (const ClientActivity& c : model.clients) {
    fmt::format_to(line,
                   "  {}: peak resident {}, chunks {}, host to device {}, device to host {}, "
                   "fetches {} ({} prefetches), writebacks {}, evictions {}, stalls {} ({} ns)\n",
                   client_label(c.client), format_bytes(c.peak_resident_bytes),
                   format_bytes(c.chunk_bytes), format_bytes(c.bytes_h2d),
                   format_bytes(c.bytes_d2h), c.fetches, c.prefetches, c.writebacks, c.evictions,
                   c.stalls, c.stall_ns);
  }
  out += "\nrecommendations:\n";
  for (const std::string& sentence : recommendations(model)) {
    fmt::format_to(line, "  - {}\n", sentence);
  }
  return out;
}

}  // namespace spillway::report
