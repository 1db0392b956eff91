// Metric lines for the benchmark programs; see metric_reporter.h for the
// contract ("metric NAME VALUE UNIT") and how programs use it.
//
// The metrics live in one process-wide list, filled by MetricReporter (from
// counters named "NAME[UNIT]") and by report_metric(), and printed once by
// run_and_report() after the table, so a program's figures stay together at
// the end of its output, easy for a person and for grep.
#include "bench/common/metric_reporter.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>

namespace spillway::bench {
namespace {

struct Metric {
  std::string name;
  double value = 0;
  std::string unit;
  bool from_median = false;  // a median of repetitions beats single runs
};

struct MetricList {
  std::mutex mutex;
  std::vector<Metric> metrics;  // in the order first reported
  bool failed = false;
};

MetricList& metric_list() {
  static MetricList list;
  return list;
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool valid_unit(std::string_view unit) {
  if (unit.empty()) return false;
  for (char c : unit) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '[' || c == ']') return false;
  }
  return true;
}

void record(std::string_view name, double value, std::string_view unit, bool from_median) {
  if (!valid_name(name) || !valid_unit(unit)) {
    report_failure("bad metric name or unit: '" + std::string(name) + "' '" + std::string(unit) +
                   "' (name [A-Za-z0-9_.-]+, unit one word)");
    return;
  }
  MetricList& list = metric_list();
  std::lock_guard lock(list.mutex);
  for (Metric& metric : list.metrics) {
    if (metric.name != name) continue;
    if (metric.from_median && !from_median) return;
    metric = Metric{std::string(name), value, std::string(unit), from_median};
    return;
  }
  list.metrics.push_back(Metric{std::string(name), value, std::string(unit), from_median});
}

// Plain decimal, no exponent for the usual range: 0.981, 9.83, 1234.5.
std::string format_value(double value) {
  if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  char text[64];
  const double magnitude = std::fabs(value);
  if (magnitude != 0 && (magnitude < 1e-3 || magnitude >= 1e15)) {
    std::snprintf(text, sizeof text, "%.6g", value);
    return text;
  }
  // Four significant digits at least, three decimals at most.
  const int decimals = magnitude >= 100 ? 1 : 3;
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  std::string result = text;
  if (result.find('.') != std::string::npos) {
    result.erase(result.find_last_not_of('0') + 1);
    if (result.back() == '.') result.pop_back();
  }
  return result;
}

// Splits "NAME[UNIT]"; false for any other counter name.
bool parse_counter_key(const std::string& key, std::string* name, std::string* unit) {
  const std::size_t open = key.find('[');
  if (open == std::string::npos || open == 0 || key.size() < open + 3 || key.back() != ']') {
    return false;
  }
  *name = key.substr(0, open);
  *unit = key.substr(open + 1, key.size() - open - 2);
  return true;
}

}  // namespace

std::string metric_counter(std::string_view name, std::string_view unit) {
  return std::string(name) + "[" + std::string(unit) + "]";
}

void report_metric(std::string_view name, double value, std::string_view unit) {
  record(name, value, unit, /*from_median=*/false);
}

void report_note(std::string_view text) { std::cout << "# " << text << std::endl; }

void report_failure(std::string_view text) {
  {
    MetricList& list = metric_list();
    std::lock_guard lock(list.mutex);
    list.failed = true;
  }
  std::cout << "# error: " << text << std::endl;
}

std::string format_metric_line(std::string_view name, double value, std::string_view unit) {
  return "metric " + std::string(name) + " " + format_value(value) + " " + std::string(unit);
}

// Plain table: colour codes would garble logs and the metric lines' neighbours.
MetricReporter::MetricReporter() : benchmark::ConsoleReporter(OO_Tabular) {}

void MetricReporter::ReportRuns(const std::vector<Run>& runs) {
  benchmark::ConsoleReporter::ReportRuns(runs);
  for (const Run& run : runs) {
    if (run.error_occurred) {
      report_failure(run.benchmark_name() + ": " + run.error_message);
      continue;
    }
    const bool is_median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (run.run_type == Run::RT_Aggregate && !is_median) continue;  // mean, stddev, cv
    for (const auto& [key, counter] : run.counters) {
      std::string name;
      std::string unit;
      if (parse_counter_key(key, &name, &unit)) record(name, counter.value, unit, is_median);
    }
  }
}

void initialize(int* argc, char** argv) { benchmark::Initialize(argc, argv); }

int run_and_report() {
  MetricReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  MetricList& list = metric_list();
  std::lock_guard lock(list.mutex);
  for (const Metric& metric : list.metrics) {
    std::cout << format_metric_line(metric.name, metric.value, metric.unit) << '\n';
  }
  std::cout.flush();
  return list.failed ? 1 : 0;
}

}  // namespace spillway::bench
