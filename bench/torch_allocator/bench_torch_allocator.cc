// bench_torch_allocator: spillway as torch's CPU allocator on the sim device
// (Note [torch's CPU allocator on the sim device]), as metric lines.
//
//   metric torch_alloc_free_pair_ns        one allocate + free of 4 KiB through
//                                          c10::GetCPUAllocator(), spillway
//                                          installed, a cached size, one thread
//                                          (goal: at most 150 ns)
//   metric torch_alloc_free_pair_torch_ns  the same through torch's own
//                                          allocator (a HostWorkScope)
//   metric train_step_torch_alloc_ms       median training step of the demo's
//                                          GPT on torch's allocator
//   metric train_step_spillway_alloc_ms    the same on spillway's, nothing
//                                          managed, a budget that holds it all
//   metric allocator_overhead_ratio        the second over the first (goal: at
//                                          most 1.05)
//
// Both sides run in one process, in alternating rounds, under
// at::RecordFunctionGuard(false) (the op hooks are not what is measured);
// torch's side runs in a HostWorkScope, which sends allocations to the
// allocator installed before spillway's.
//
//   bench_torch_allocator [--rounds N] [--steps-per-round N] [--pairs N]
//                         [--benchmark_* flags]
#include <ATen/record_function.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "bench/common/median.h"
#include "bench/common/metric_reporter.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"
#include "tools/train_demo/trainer.h"

namespace spillway::bench {
namespace {

constexpr const char* kConf =
    "device:sim,device_budget:1GiB,sim_capacity:2GB,chunk_size:2MiB,policy:lru";

struct Options {
  train_demo::TrainerOptions trainer;
  int rounds = 4;
  int steps_per_round = 3;
  int pairs = 1'000'000;
};
Options g_options;

double pair_ns(bool on_torch) {
  std::optional<torch_bridge::HostWorkScope> host;
  if (on_torch) host.emplace();
  c10::Allocator* allocator = c10::GetAllocator(c10::DeviceType::CPU);
  { c10::DataPtr warm = allocator->allocate(4096); }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < g_options.pairs; ++i) {
    c10::DataPtr block = allocator->allocate(4096);
    benchmark::DoNotOptimize(block.get());
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         g_options.pairs;
}

double step_ms(train_demo::Trainer& trainer, bool on_torch) {
  std::optional<torch_bridge::HostWorkScope> host;
  if (on_torch) host.emplace();
  at::RecordFunctionGuard no_callbacks(/*is_enabled=*/false);
  const auto start = std::chrono::steady_clock::now();
  trainer.step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void BM_TorchAllocator(benchmark::State& state) {
  train_demo::Trainer trainer(g_options.trainer);
  std::vector<double> torch_pairs, spillway_pairs, torch_steps, spillway_steps;
  for (auto _ : state) {
    step_ms(trainer, true);  // warmup: both caches hold a step's sizes
    step_ms(trainer, false);
    for (int round = 0; round < g_options.rounds; ++round) {
      torch_pairs.push_back(pair_ns(true));
      spillway_pairs.push_back(pair_ns(false));
      for (int i = 0; i < g_options.steps_per_round; ++i)
        torch_steps.push_back(step_ms(trainer, true));
      for (int i = 0; i < g_options.steps_per_round; ++i)
        spillway_steps.push_back(step_ms(trainer, false));
    }
  }
  const double torch_ms = median(torch_steps), spillway_ms = median(spillway_steps);
  state.counters[metric_counter("torch_alloc_free_pair_ns", "ns")] = median(spillway_pairs);
  state.counters[metric_counter("torch_alloc_free_pair_torch_ns", "ns")] = median(torch_pairs);
  state.counters[metric_counter("train_step_torch_alloc_ms", "ms")] = torch_ms;
  state.counters[metric_counter("train_step_spillway_alloc_ms", "ms")] = spillway_ms;
  state.counters[metric_counter("allocator_overhead_ratio", "ratio")] = spillway_ms / torch_ms;
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  initialize(&argc, argv);
  Options& options = g_options;
  CLI::App app{"bench_torch_allocator: spillway as torch's CPU allocator on the sim device"};
  app.add_option("--rounds", options.rounds, "alternating rounds")->check(CLI::PositiveNumber);
  app.add_option("--steps-per-round", options.steps_per_round, "timed steps per side and round")
      ->check(CLI::PositiveNumber);
  app.add_option("--pairs", options.pairs, "allocate/free pairs per side and round")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  spillway::configure(kConf);
  spillway::activate();  // installs spillway as torch's CPU allocator
  report_note(std::string("configuration: ") + kConf);
  benchmark::RegisterBenchmark("torch_allocator", BM_TorchAllocator)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  return run_and_report();
}
