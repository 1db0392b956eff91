#include "tools/report/recommendations.h"

#include <fmt/format.h>

#include "tools/report/report_units.h"

namespace spillway::report {

namespace {

constexpr double kLowBudgetUse = 0.5;        // peak reserved / budget below this
constexpr double kMovedPerStepLimit = 2.0;   // bytes moved per step / model size above this
constexpr double kStallShareLimit = 0.10;    // stall time / traced time above this
constexpr double kFragmentationLimit = 1.3;  // peak reserved / peak allocated above this

double ratio(std::uint64_t numerator, std::uint64_t denominator) {
  return static_cast<double>(numerator) / static_cast<double>(denominator);
}

}  // namespace

std::vector<std::string> recommendations(const ReportModel& model) {
  const ReportTotals& totals = model.totals;
  std::vector<std::string> out;
  if (totals.ooms > 0) {
    out.push_back(fmt::format(
        "The allocator ran out of device memory {} time{}; the largest failed request was {} "
        "({} bytes). Raise device_budget, or lower what the run keeps on the device.",
        totals.ooms, totals.ooms == 1 ? "" : "s", format_bytes(totals.largest_oom_request_bytes),
        totals.largest_oom_request_bytes));
  }
  if (totals.budget_overruns > 0) {
    out.push_back(fmt::format(
        "An op needed chunks that did not fit in the budget {} time{}, so they were made resident "
        "past it (by up to {}). Raise device_budget to at least the run's smallest budget ({}), "
        "or lower chunk_size so that an op's chunks hold less besides its own tensors.",
        totals.budget_overruns, totals.budget_overruns == 1 ? "" : "s",
        format_bytes(totals.largest_overrun_bytes),
        totals.min_budget_bytes > 0 ? format_bytes(totals.min_budget_bytes)
                                    : std::string("min_budget_bytes in memory_stats")));
  }
  if (model.device_budget_bytes && *model.device_budget_bytes > 0 && totals.ooms == 0 &&
      totals.evictions == 0 &&
      ratio(totals.peak_reserved_bytes, *model.device_budget_bytes) < kLowBudgetUse) {
    out.push_back(fmt::format(
        "Peak reserved memory ({}) is {:.0f}% of the device budget ({}); a device_budget near {} "
        "would leave the rest of the device to other work.",
        format_bytes(totals.peak_reserved_bytes),
        100 * ratio(totals.peak_reserved_bytes, *model.device_budget_bytes),
        format_bytes(*model.device_budget_bytes),
        format_bytes(totals.peak_reserved_bytes + totals.peak_reserved_bytes / 4)));
  }
  const std::uint64_t moved = totals.bytes_h2d + totals.bytes_d2h;
  if (totals.steps > 0 && totals.model_size_bytes > 0 &&
      ratio(moved / totals.steps, totals.model_size_bytes) > kMovedPerStepLimit) {
    out.push_back(fmt::format(
        "Each step moved {} between host and device on average, {:.1f}x the model's chunks ({}); "
        "a bigger device_budget or a placement policy that keeps hot chunks resident would move "
        "less.",
        format_bytes(moved / totals.steps), ratio(moved / totals.steps, totals.model_size_bytes),
        format_bytes(totals.model_size_bytes)));
  }
  if (totals.duration_ns > 0 && ratio(totals.stall_ns, totals.duration_ns) > kStallShareLimit) {
    out.push_back(fmt::format(
        "The host waited for chunk moves for {} ({:.0f}% of the traced time); prefetching earlier "
        "or a bigger device_budget would hide more of the copies.",
        format_duration_ns(totals.stall_ns), 100 * ratio(totals.stall_ns, totals.duration_ns)));
  }
  if (totals.peak_allocated_bytes > 0 &&
      ratio(totals.peak_reserved_bytes, totals.peak_allocated_bytes) > kFragmentationLimit) {
    const std::string chunk_size =
        model.chunk_size_bytes ? fmt::format(" (now {})", format_bytes(*model.chunk_size_bytes))
                               : std::string();
    out.push_back(fmt::format(
        "Peak reserved ({}) is {:.2f}x peak allocated ({}): the allocator's segments are "
        "fragmented. A different chunk_size{} may fit the allocation sizes better; "
        "spillway-replay compares sizes on this trace.",
        format_bytes(totals.peak_reserved_bytes),
        ratio(totals.peak_reserved_bytes, totals.peak_allocated_bytes),
        format_bytes(totals.peak_allocated_bytes), chunk_size));
  }
  if (out.empty()) {
    // Say what was checked, so "nothing" is not read as "all is well" where
    // the trace lacks the events to tell.
    std::string checked = "Nothing to recommend: no out-of-memories";
    if (model.has_chunk_events) checked += ", chunk traffic and stalls within limits";
    checked += totals.segment_allocs > 0
                   ? ", and peak reserved stays within 1.3x of peak allocated."
                   : "; the trace has no segment events, so fragmentation is not judged.";
    out.push_back(std::move(checked));
  }
  return out;
}

}  // namespace spillway::report
