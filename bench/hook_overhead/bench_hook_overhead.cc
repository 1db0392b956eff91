// bench_hook_overhead: the cost of spillway's op hooks on a training step
// when nothing spills, as metric lines.
//
//   metric train_step_plain_ms     median step of the demo's GPT without spillway
//   metric train_step_spillway_ms  the same with its parameters and gradients
//                                  managed, under a budget that holds them all
//   metric hook_overhead_ratio     spillway over plain: the median over rounds
//                                  of the round's managed median step over its
//                                  plain one (goal: at most 1.03)
//   metric train_step_hooks_idle_ms  the callback installed, nothing managed:
//                                  RecordFunction's own cost (boxing every
//                                  op's inputs) apart from lookups and acquires
//
// One model trains in alternating rounds (plain, idle, managed; manage and
// unmanage between rounds, untimed), so slow drift of the machine (other
// processes, frequency) falls on all sides alike; each side's step figure is
// the median of its steps after a warmup, and the ratio is the median of the
// per-round ratios, each pair of sides measured back to back. With the budget large enough, no
// chunk ever moves, so what remains is the per-op work: the RecordFunction callback, the binding
// lookups and the chunk-manager acquire/release.
//
// Note [Plain steps in a process with the hooks]
// The bridge's callback stays installed once the first manage() put it there,
// so a plain step runs under at::RecordFunctionGuard(false), which makes every
// RecordFunction in it (and in the autograd work it starts, which inherits the
// thread-local state) take the same early exit as in a process without any
// callback.
//
//   bench_hook_overhead [--rounds N] [--steps-per-round N] [--warmup N]
//                       [--batch N] [--seq N] [--layers N] [--d-model N]
//                       [--benchmark_* flags]
#include <ATen/record_function.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench/common/median.h"
#include "bench/common/metric_reporter.h"
#include "hooks/torch/spillway_torch.h"
#include "tools/train_demo/trainer.h"

namespace spillway::bench {
namespace {

// Everything fits: model data is tens of MiB.
constexpr const char* kConf =
    "device:sim,device_budget:1GiB,sim_capacity:2GB,chunk_size:2MiB,policy:lru";

struct Options {
  train_demo::TrainerOptions trainer;
  int rounds = 8;
  int steps_per_round = 3;
  int warmup = 2;  // steps per side before the first timed round
};
Options g_options;

double timed_step_ms(train_demo::Trainer& trainer) {
  const auto start = std::chrono::steady_clock::now();
  trainer.step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Note [Plain steps in a process with the hooks].
double plain_step_ms(train_demo::Trainer& trainer) {
  at::RecordFunctionGuard no_callbacks(/*is_enabled=*/false);
  return timed_step_ms(trainer);
}

void BM_HookOverhead(benchmark::State& state) {
  train_demo::Trainer trainer(g_options.trainer);
  std::vector<double> plain, idle, managed;
  std::vector<double> managed_over_plain;  // per round
  const auto steps = static_cast<std::size_t>(g_options.steps_per_round);
  // The round's last `steps` figures of `side`.
  auto round_median = [steps](const std::vector<double>& side) {
    return median(std::vector<double>(side.end() - static_cast<std::ptrdiff_t>(steps), side.end()));
  };
  for (auto _ : state) {
    for (int i = 0; i < g_options.warmup; ++i) plain_step_ms(trainer);
    spillway::manage(*trainer.model());
    for (int i = 0; i < g_options.warmup; ++i) trainer.step();
    spillway::unmanage(*trainer.model());
    for (int round = 0; round < g_options.rounds; ++round) {
      for (std::size_t i = 0; i < steps; ++i) plain.push_back(plain_step_ms(trainer));
      for (std::size_t i = 0; i < steps; ++i) idle.push_back(timed_step_ms(trainer));
      spillway::manage(*trainer.model());
      for (std::size_t i = 0; i < steps; ++i) managed.push_back(timed_step_ms(trainer));
      spillway::unmanage(*trainer.model());
      managed_over_plain.push_back(round_median(managed) / round_median(plain));
    }
  }
  state.counters[metric_counter("train_step_plain_ms", "ms")] = median(plain);
  state.counters[metric_counter("train_step_spillway_ms", "ms")] = median(managed);
  state.counters[metric_counter("train_step_hooks_idle_ms", "ms")] = median(idle);
  state.counters[metric_counter("hook_overhead_ratio", "ratio")] = median(managed_over_plain);
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  initialize(&argc, argv);
  Options& options = g_options;
  CLI::App app{"bench_hook_overhead: spillway's op-hook cost on a training step, nothing spilled"};
  app.add_option("--rounds", options.rounds, "alternating plain/managed rounds")
      ->check(CLI::PositiveNumber);
  app.add_option("--steps-per-round", options.steps_per_round, "timed steps per side and round")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed steps per side first");
  app.add_option("--batch", options.trainer.batch, "sequences per step");
  app.add_option("--seq", options.trainer.model.sequence, "sequence length");
  app.add_option("--layers", options.trainer.model.layers, "transformer blocks");
  app.add_option("--d-model", options.trainer.model.d_model, "model width");
  CLI11_PARSE(app, argc, argv);
  spillway::configure(kConf);
  report_note(std::string("configuration: ") + kConf);
  benchmark::RegisterBenchmark("hook_overhead", BM_HookOverhead)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  return run_and_report();
}
