// bench_replay: replays each shipped GPT-2 allocation trace (tests/data/
// gpt2_*.csv, see docs/traces.md) through the caching allocator on the
// simulated device, with the default chunk size and no budget, and prints
//
//   metric replay_fragmentation_<trace> <peak reserved / peak allocated> ratio
//
// plus the replay time in Google Benchmark's table. The goal is <= 1.10.
//
//   bench_replay [TRACE.csv ...]   (default: every tests/data/gpt2_*.csv)
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "allocator/config/config.h"
#include "bench/common/metric_reporter.h"
#include "tools/replay/allocation_replay.h"
#include "tools/replay/allocation_trace.h"

namespace {

std::vector<std::filesystem::path> shipped_traces() {
  std::vector<std::filesystem::path> traces;
  for (const auto& entry : std::filesystem::directory_iterator(SPILLWAY_TRACE_DIR)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("gpt2_") && name.ends_with(".csv")) traces.push_back(entry.path());
  }
  std::sort(traces.begin(), traces.end());
  return traces;
}

void register_replay(const std::filesystem::path& path) {
  const std::string name = path.stem().string();
  benchmark::RegisterBenchmark(
      ("replay/" + name).c_str(),
      [path, name](benchmark::State& state) {
        const spillway::AllocationTraceResult loaded =
            spillway::load_allocation_trace(path.string());
        if (!loaded.ok()) {
          state.SkipWithError(loaded.error.c_str());
          return;
        }
        spillway::ReplayOptions options;
        options.chunk_size = spillway::Config{}.chunk_size;
        options.expandable_segments = spillway::Config{}.expandable_segments;
        spillway::ReplayResult result;
        std::string error;
        for (auto _ : state) {
          if (!spillway::replay_allocations(loaded.trace, options, &result, &error)) {
            state.SkipWithError(error.c_str());
            return;
          }
        }
        state.counters["events"] = static_cast<double>(loaded.trace.events.size());
        spillway::bench::report_metric("replay_fragmentation_" + name, result.fragmentation(),
                                       "ratio");
        spillway::bench::report_metric("replay_peak_reserved_bytes_" + name,
                                       static_cast<double>(result.peak_reserved_bytes()), "bytes");
      })
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
}

}  // namespace

int main(int argc, char** argv) {
  spillway::bench::initialize(&argc, argv);
  std::vector<std::filesystem::path> traces;
  for (int i = 1; i < argc; ++i) traces.emplace_back(argv[i]);
  if (traces.empty()) traces = shipped_traces();
  if (traces.empty()) spillway::bench::report_failure("no traces in " SPILLWAY_TRACE_DIR);
  for (const auto& path : traces) register_replay(path);
  return spillway::bench::run_and_report();
}
