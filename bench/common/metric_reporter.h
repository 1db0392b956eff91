// Metric lines for spillway's benchmark programs.
//
// Every benchmark program prints, besides Google Benchmark's usual table, one
// line per figure in exactly this form (design: "bench/ measures and prints"):
//
//   metric NAME VALUE UNIT        e.g.  metric sim_copy_vs_modelled_bw 0.98 ratio
//
// NAME is [A-Za-z0-9_.-]+, VALUE a plain decimal number, UNIT one word with no
// spaces (GB/s, ns, ratio, bytes, ...). bench/run.sh and tools/gpu_check.sh
// collect these lines; docs/benchmarks.md says what each NAME means.
//
// A program produces metrics in either of two ways:
//  1. A Google Benchmark counter named "NAME[UNIT]" (make the key with
//     metric_counter) becomes a metric line; other counters stay in the table.
//       state.counters[metric_counter("sim_copy_throughput", "GB/s")] = gbps;
//  2. report_metric("name", value, "unit") for figures computed outside a
//     benchmark loop.
// Metric lines are printed together after all benchmarks ran, in the order
// first reported; a name reported twice keeps its last value, except that the
// median of a repeated benchmark (--benchmark_repetitions) wins over single
// runs.
//
// A program's main is then a few lines:
//
//   int main(int argc, char** argv) {
//     spillway::bench::initialize(&argc, argv);  // takes the --benchmark_* flags
//     ... parse the program's own flags from what is left, register benchmarks ...
//     return spillway::bench::run_and_report();
//   }
//
// run_and_report() returns non-zero when a benchmark failed (SkipWithError)
// or report_failure() was called, so scripts notice broken benchmarks.
#pragma once

#include <benchmark/benchmark.h>

#include <string>
#include <string_view>
#include <vector>

namespace spillway::bench {

// The counter key "NAME[UNIT]" that MetricReporter turns into a metric line.
std::string metric_counter(std::string_view name, std::string_view unit);

// Records a figure; printed as "metric NAME VALUE UNIT" by run_and_report().
void report_metric(std::string_view name, double value, std::string_view unit);

// Prints "# TEXT" now: context that is not a figure (e.g. "cuda: skipped (...)").
void report_note(std::string_view text);

// Prints "# error: TEXT" now and makes run_and_report() return non-zero.
void report_failure(std::string_view text);

// Formats a metric line ("metric NAME VALUE UNIT", no newline).
std::string format_metric_line(std::string_view name, double value, std::string_view unit);

// Google Benchmark's console table, plus collecting "NAME[UNIT]" counters.
class MetricReporter : public benchmark::ConsoleReporter {
 public:
  MetricReporter();
  void ReportRuns(const std::vector<Run>& runs) override;
};

// benchmark::Initialize: removes the --benchmark_* flags from argv.
void initialize(int* argc, char** argv);

// Runs the registered benchmarks through MetricReporter, prints the metric
// lines, shuts Google Benchmark down. Returns the process exit code.
int run_and_report();

}  // namespace spillway::bench
