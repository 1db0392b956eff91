// bench_replay: replays each shipped GPT-2 allocation trace (tests/data/
// gpt2_*.csv, see docs/traces.md), the PyTorch memory snapshots recorded on
// an H200 (tests/data/h200_*.pickle), and the PyTorch memory snapshots that
// tools/tracegen/make_snapshots.py wrote into the build folder through the
// caching allocator on the simulated device, with the default chunk size and
// no budget, and prints
//
//   metric replay_fragmentation_<trace> <peak reserved / peak allocated> ratio
//
// and for a snapshot, against PyTorch's own figure from its segment entries
// (Note [The native figure from a snapshot]),
//
//   metric native_fragmentation_<trace> <PyTorch's peak reserved / peak allocated> ratio
//   metric replay_vs_native_<trace> <spillway's peak reserved / PyTorch's> ratio
//
// The comparison is of peak reserved bytes: both allocators served the same
// requests, and the two fragmentation figures divide by allocated bytes that
// each counts its own way (spillway its blocks, PyTorch's its requests rounded).
//
// plus the replay time in Google Benchmark's table. The goal is <= 1.10.
//
//   bench_replay [TRACE ...]   (default: every tests/data/gpt2_*.csv and the
//                               generated snapshots)
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
    // gpt2_*.csv: synthetic; h200_*.pickle: snapshots recorded on an H200.
    if ((name.starts_with("gpt2_") && name.ends_with(".csv")) ||
        (name.starts_with("h200_") && name.ends_with(".pickle")))
      traces.push_back(entry.path());
  }
  std::sort(traces.begin(), traces.end());
#ifdef SPILLWAY_SNAPSHOT_DIR
  // The snapshots that stand for a run (the others are broken on purpose,
  // or the same history differently pickled).
  for (const char* name : {"transformer_train.pickle", "mid_run.pickle"})
    traces.push_back(std::filesystem::path(SPILLWAY_SNAPSHOT_DIR) / name);
#endif
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
        const double native = loaded.trace.recorded_fragmentation();
        if (loaded.trace.format == spillway::AllocationTrace::Format::snapshot && native > 0) {
          spillway::bench::report_metric("native_fragmentation_" + name, native, "ratio");
          spillway::bench::report_metric(
              "replay_vs_native_" + name,
              static_cast<double>(result.peak_reserved_bytes()) /
                  static_cast<double>(loaded.trace.recorded_peak_reserved_bytes),
              "ratio");
        }
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
