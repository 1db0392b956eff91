// bench_train: the demo's GPT (tools/train_demo) trained on the simulated
// device under a budget that makes its chunks move every step, with the copy
// bandwidth set so that one step's chunk traffic takes about as long as its
// compute: how much of the step is stall under each policy, and how close the
// planned one comes to the cost simulator's bound for the same trace.
//
//   metric train_budget_mib             the device budget: --budget, or by default
//                                       the peak of non-model memory plus half the
//                                       model's chunks (measured with everything resident)
//   metric train_compute_ms             a step with instant copies (compute)
//   metric train_h2d_mib_per_step       the chunk traffic of that step
//   metric train_sim_bandwidth_gbps     traffic / compute: the modelled bandwidth
//   metric train_step_ms_{planned,lru}  median step at that bandwidth
//   metric train_stall_fraction_{planned,lru}  host stall over step time
//                                       (goal for planned: at most 0.05 where
//                                       the simulator hides the traffic)
//   metric train_stall_expected_fraction_planned  the stall the copy model
//                                       expected (stall_ns.expected), same base
//   metric train_spill_wait_fraction_{planned,lru}  the host's waits while the
//                                       allocator gave memory back for spills
//                                       (CachingAllocator::release_wait_ns), same base
//   metric train_step_vs_compute_planned  planned step over train_compute_ms
//   metric train_sim_budget_mib         the budget the simulator runs at: the
//                                       runs', or the smallest it accepts if more
//   metric train_sim_stall_fraction_planned  the cost simulator's, same trace
//   metric train_sim_spill_wait_fraction_planned  the simulator's ops waiting
//                                       for room a victim's write-back holds
//   metric train_traced_step_ms         the planned run's last step, from its trace
//   metric train_step_vs_sim_bound      that step over the simulator's bound
//                                       for it (goal <= 1.15)
//   metric train_sim_step_vs_bound_{planned,belady}  the simulator's own steady
//                                       step under that policy over the same bound
//   metric train_sim_step_vs_bound_fastest  the fastest plan the simulator knows
//                                       (tracer/planner/fastest_plan.h), same bound
//   metric train_step_vs_sim_fastest    the traced step over that plan's step
//   metric train_hideable_budget_mib    the smallest larger budget where the
//                                       simulator hides the planned traffic (Note
//                                       [Where the stall goal applies]); the planned
//                                       run there prints the figures above with
//                                       the suffix _hideable
//
// Each run is a child process of its own (spillway's configuration is once
// per process): bench_train --child POLICY BANDWIDTH TRACE prints one
// "child-result" line, which the parent reads.
//
//   bench_train [--steps N] [--warmup N] [--budget SIZE|auto] [--threads N] [--layers N]
//               [--d-model N] [--batch N] [--seq N] [--optimizer torch-adam|spillway-adam]
//
// --optimizer spillway-adam puts Adam's state in chunks too (the demo's
// option): the budget then holds mostly model data, and the chunks on the
// host are updated there.
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/config/options.h"
#include "allocator/runtime.h"
#include "bench/common/median.h"
#include "bench/common/metric_reporter.h"
#include "bench/common/step_bound_note.h"
#include "bench/train/traced_step.h"
#include "hooks/torch/spillway_torch.h"
#include "tools/train_demo/trainer.h"
#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/fastest_plan.h"

namespace spillway::bench {
namespace {

struct Options {
  train_demo::TrainerOptions trainer;
  int steps = 6;   // timed steps per run
  int warmup = 3;  // untimed steps first (the planned policy's traced step among them)
  // "auto": Note [A budget that makes chunks move].
  std::string budget = "auto";
  std::string chunk_size = "2MiB";
  int threads = 1;  // torch's intra-op threads in each run
};

struct ChildResult {
  double step_ms = 0;               // median timed step
  double stall_ms = 0;              // per timed step
  double expected_ms = 0;           // per timed step
  double h2d_bytes = 0;             // per timed step
  double total_step_ms = 0;         // sum of timed steps
  double spill_wait_ms = 0;         // per timed step: the allocator's release waits
  double chunk_capacity_bytes = 0;  // the model's chunks, at the end
  double non_model_peak_bytes = 0;  // allocator bytes outside chunks, the run's peak
};

// Note [A budget that makes chunks move]
// A fixed default budget stops meaning anything as the model, its packing or
// the activations change: 64 MiB once moved 14 MiB a step and now holds the
// whole demo model. By default the budget is measured instead: a run with
// everything resident gives the peak of non-model memory (activations,
// Adam's state) and the bytes of the model's chunks, and the budget is that
// peak plus half those chunks, so about half the model moves each step; or,
// where more, the smallest budget the cost simulator accepts for that run's
// traced step, so that the simulator can run at the budget measured.

// The simulated device's capacity in every run, and the step of the budget
// searches (hideable_budget, report_budget_sweep), which stop there.
constexpr std::uint64_t kMiB = 1 << 20;
constexpr std::uint64_t kSimCapacityMiB = 512;

double stat(const nlohmann::json& json, const char* key) {
  return json.contains(key) ? json.at(key).get<double>() : 0.0;
}

std::string configuration(const Options& options, const std::string& policy, double bandwidth,
                          const std::string& trace) {
  std::string conf = fmt::format(
      "device:sim,chunk_size:{},device_budget:{},sim_capacity:{}MiB,policy:{},log:error",
      options.chunk_size, options.budget, kSimCapacityMiB, policy);
  if (bandwidth > 0) conf += fmt::format(",sim_bandwidth:{:.0f}B/s", bandwidth);
  if (trace != "-") conf += ",trace:" + trace;
  return conf;
}

// One run, in this process: prints the child-result line.
int run_child(const Options& options, const std::string& policy, double bandwidth,
              const std::string& trace) {
  // One compute thread: the simulated device's copies run on threads of
  // their own, and torch's spinning workers on a shared machine make step
  // times swing several-fold.
  torch::set_num_threads(options.threads);
  spillway::configure(configuration(options, policy, bandwidth, trace));
  train_demo::TrainerOptions trainer_options = options.trainer;
  trainer_options.manage = true;
  train_demo::Trainer trainer(trainer_options);
  for (int i = 0; i < options.warmup; ++i) trainer.step();
  const nlohmann::json before = nlohmann::json::parse(spillway::memory_stats_json());
  // Note [Time spent giving memory back] (caching_allocator.cc): host time
  // that stall_ns does not count.
  const CachingAllocator* allocator = Runtime::process().active_allocator();
  if (allocator == nullptr) throw std::runtime_error("spillway is not active");
  const std::uint64_t release_wait_before = allocator->release_wait_ns();
  std::vector<double> steps;
  for (int i = 0; i < options.steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    trainer.step();
    steps.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  const nlohmann::json after = nlohmann::json::parse(spillway::memory_stats_json());
  const double spill_wait_ms =
      static_cast<double>(allocator->release_wait_ns() - release_wait_before) / 1e6 / options.steps;
  const auto per_step = [&](const char* key) {
    return (stat(after, key) - stat(before, key)) / options.steps;
  };
  double total = 0;
  for (double ms : steps) total += ms;
  fmt::print("child-result {} {} {} {} {} {} {} {}\n", median(steps), per_step("stall_ns") / 1e6,
             per_step("stall_ns.expected") / 1e6, per_step("bytes_moved.h2d"), total, spill_wait_ms,
             stat(after, "chunk_bytes.capacity"), stat(after, "allocated_bytes.non_model.peak"));
  std::fflush(stdout);
  return 0;
}

// Runs this program again as a child and reads its result.
ChildResult run_in_child(const std::vector<std::string>& base_args, const std::string& policy,
                         double bandwidth, const std::string& trace) {
  // popen runs a shell, whose /proc/self/exe is the shell: name this program.
  std::string command = "'" + std::filesystem::read_symlink("/proc/self/exe").string() + "'";
  for (const std::string& arg : base_args) command += " '" + arg + "'";
  // Its errors too: the parent's message carries them.
  command += fmt::format(" --child {} {:.0f} {} 2>&1", policy, bandwidth, trace);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("cannot start " + command);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  const std::size_t at = output.find("child-result ");
  if (status != 0 || at == std::string::npos) {
    // torch's errors end with their C++ backtrace: not for the reader.
    output = output.substr(0, output.find("\nException raised from"));
    throw std::runtime_error(
        fmt::format("the {} run failed (status {}): {}", policy, status, output));
  }
  std::istringstream line(output.substr(at + 13));
  ChildResult result;
  line >> result.step_ms >> result.stall_ms >> result.expected_ms >> result.h2d_bytes >>
      result.total_step_ms >> result.spill_wait_ms >> result.chunk_capacity_bytes >>
      result.non_model_peak_bytes;
  return result;
}

// `args` with `--budget budget` in place of any budget they give.
std::vector<std::string> with_budget(const std::vector<std::string>& args,
                                     const std::string& budget) {
  std::vector<std::string> result;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--budget") {
      ++i;  // and its value
      continue;
    }
    if (args[i].starts_with("--budget=")) continue;
    result.push_back(args[i]);
  }
  result.insert(result.end(), {"--budget", budget});
  return result;
}

// A trace file for one child run, in the temporary folder.
std::string trace_path(const std::string& run) {
  return (std::filesystem::temp_directory_path() /
          fmt::format("bench_train_{}_{}.trace", getpid(), run))
      .string();
}

// The step event that ends a run's last timed step.
std::uint64_t last_step(const Options& options) {
  return static_cast<std::uint64_t>(options.warmup + options.steps);
}

// The step that ended with event `step` in the trace file, which is
// removed. Throws when it cannot be read.
TracedStep read_traced_step(const std::string& trace, std::uint64_t step) {
  const TraceReadResult read = read_trace_file(trace, {.allow_missing_end = true});
  std::filesystem::remove(trace);
  if (!read.ok()) throw std::runtime_error(read.error);
  TracedStep traced = traced_step(*read.trace, step);
  if (!traced.error.empty()) throw std::runtime_error(traced.error);
  return traced;
}

// Note [A budget that makes chunks move]: `options.budget`, or measured.
std::string resolve_budget(const Options& options, const std::vector<std::string>& base_args) {
  if (options.budget != "auto") return options.budget;
  // Below sim_capacity, above anything the demo's sizes need.
  const std::string trace = trace_path("everything");
  const ChildResult everything =
      run_in_child(with_budget(base_args, "480MiB"), "planned", 0, trace);
  if (everything.h2d_bytes > 0)
    throw std::runtime_error("--budget auto: chunks moved with a budget of 480 MiB");
  const TracedStep traced = read_traced_step(trace, last_step(options));
  const double mib = 1048576.0;
  // The cost simulator cannot run below its smallest budget: at least that.
  plan::CostModel model;
  model.chunk_size = traced.chunk_size;
  const double simulated = static_cast<double>(plan::smallest_budget(traced.step, model));
  const double bytes =
      std::max(everything.non_model_peak_bytes + everything.chunk_capacity_bytes / 2, simulated);
  report_note(fmt::format(
      "--budget auto: non-model peak {:.1f} MiB, chunks {:.1f} MiB, the simulator's smallest "
      "budget {:.1f} MiB",
      everything.non_model_peak_bytes / mib, everything.chunk_capacity_bytes / mib,
      simulated / mib));
  return fmt::format("{:.0f}MiB", std::ceil(bytes / mib));
}

// The simulator's steady step under `policy` over the bound; nothing when
// the policy cannot run the trace.
std::optional<double> simulated_step_vs_bound(const plan::StepTrace& step,
                                              const plan::CostModel& model, plan::SimPolicy policy,
                                              const plan::StepBound& bound) {
  const plan::SimResult simulated = plan::simulate(step, model, policy, 4);
  if (!simulated.ok()) return std::nullopt;
  return simulated.last().step_ns / bound.bound_ns;
}

// Note [The goal beside the best known plan]
// train_step_vs_sim_bound's goal (at most 1.15) sets the run against a lower
// bound (step_bound), which no schedule may beat but which no schedule need
// reach either. The fastest plan the simulator knows on the same traced
// step (fastest_known_plan: the planner's prefetch reserves and headrooms,
// and offline Belady) is a step some schedule does reach, so the best step
// lies between the two: train_sim_step_vs_bound_fastest says how loose the
// bound can be, and where it is above 1.15 no known schedule meets the goal.
// train_step_vs_sim_fastest is the run against that plan: what the runtime's
// policy, which follows the traced accesses online rather than a plan,
// leaves of what is known to be possible.

// The simulator's figures for a traced step, each metric's name ending in
// `suffix`.
void report_simulated(const TracedStep& traced, const plan::CostModel& model,
                      const std::string& suffix) {
  const plan::StepBound bound = plan::step_bound(traced.step, model);
  const plan::SimResult simulated = plan::simulate(traced.step, model, plan::SimPolicy::planned, 4);
  report_note(fmt::format("traced step{}: {} ops, {}", suffix, traced.step.ops.size(),
                          step_bound_note(bound)));
  report_metric("train_sim_bound_ms" + suffix, bound.bound_ns / 1e6, "ms");
  if (!simulated.ok()) throw std::runtime_error("cost simulator, planned: " + simulated.error);
  report_metric("train_sim_stall_fraction_planned" + suffix,
                simulated.last().stall_ns / simulated.last().step_ns, "ratio");
  report_metric("train_sim_spill_wait_fraction_planned" + suffix,
                simulated.last().spill_wait_ns / simulated.last().step_ns, "ratio");
  report_metric("train_sim_step_vs_bound_planned" + suffix,
                simulated.last().step_ns / bound.bound_ns, "ratio");
  const plan::SimResult belady = plan::simulate(traced.step, model, plan::SimPolicy::belady, 4);
  if (!belady.ok()) throw std::runtime_error("cost simulator, belady: " + belady.error);
  report_metric("train_sim_step_vs_bound_belady" + suffix, belady.last().step_ns / bound.bound_ns,
                "ratio");
  // How far the bound can be from the best step: Note [The goal beside the
  // best known plan].
  const plan::FastestPlan fastest = plan::fastest_known_plan(traced.step, model);
  report_note(fmt::format("fastest known plan{}: {}", suffix, fastest.describe()));
  report_metric("train_sim_step_vs_bound_fastest" + suffix, fastest.steady_step_ns / bound.bound_ns,
                "ratio");
  // The traced step's own wall time: the same step the bound is for.
  report_metric("train_traced_step_ms" + suffix, traced.wall_ns / 1e6, "ms");
  report_metric("train_step_vs_sim_bound" + suffix, traced.wall_ns / bound.bound_ns, "ratio");
  report_metric("train_step_vs_sim_fastest" + suffix, traced.wall_ns / fastest.steady_step_ns,
                "ratio");
}

// Note [Where the stall goal applies]
// The planned policy's stall goal (at most 0.05 of the step) applies where
// the cost simulator says the traffic can be hidden. At the default budget
// (half the chunks resident) it does not: the simulator's own planned
// policy stalls about 0.4 of its step there, and its offline Belady with
// prefetch takes 1.5 to 1.7 times the bound. Nor at any budget where chunks
// move, with the bandwidth the benchmark's construction gives each
// (report_budget_sweep). So the benchmark also finds the smallest budget,
// above the one measured, at which the simulator, on the traced step and
// at the same bandwidth, hides the planned policy's traffic (a stall of at
// most kHiddenStall of its step) while chunks still move, and runs the
// planned policy there. "Hidden" is stricter than the goal on purpose: at
// 55 MiB the simulator expects 0.047, the run measures 0.05 to 0.09, and a
// goal tested where the model itself expects it to be missed by a hair
// tests the noise. Budgets go up 1 MiB at a time to the first at which
// nothing moves; the simulator takes the traced step's non-model bytes,
// which do not depend on the budget.
//
// The search runs on the measured run's traced step, whose ops took longer
// than at a larger budget (their allocations waited for spills), which
// leaves more time to hide copies behind: the budget found there was not
// hidden on the trace of the run made at it (0.04 to 0.14 of the step
// expected). So each budget found is checked on its own run's traced step,
// and while the simulator does not hide the traffic there, the search goes
// on from that trace, kHideableSearches times at most.
constexpr double kHiddenStall = 0.01;
constexpr int kHideableSearches = 3;

std::optional<std::uint64_t> hideable_budget(const plan::StepTrace& step, plan::CostModel model) {
  const std::uint64_t start = (model.device_budget / kMiB + 1) * kMiB;
  for (std::uint64_t budget = start; budget <= kSimCapacityMiB * kMiB; budget += kMiB) {
    model.device_budget = budget;
    const plan::SimResult simulated = plan::simulate(step, model, plan::SimPolicy::planned, 4);
    if (!simulated.ok()) continue;
    const plan::StepCost& last = simulated.last();
    if (last.h2d_bytes == 0) return std::nullopt;
    if (last.stall_ns <= kHiddenStall * last.step_ns) return budget;
  }
  return std::nullopt;
}

// The simulator's view of every budget from `model`'s up to the first at
// which nothing moves, each at the bandwidth the benchmark's construction
// would give it (its own traffic with instant copies over the step's
// compute), as notes: whether any budget makes the traffic hideable.
void report_budget_sweep(const plan::StepTrace& step, plan::CostModel model) {
  report_note("the simulator at each budget, with copies taking as long as compute:");
  report_note(
      "budget MiB | MiB/step | GB/s | planned stall | planned step/bound | belady step/bound");
  for (std::uint64_t budget = model.device_budget; budget <= kSimCapacityMiB * kMiB;
       budget += kMiB) {
    model.device_budget = budget;
    plan::CostModel instant = model;
    instant.h2d_bytes_per_s = instant.d2h_bytes_per_s = 0;
    const plan::SimResult traffic = plan::simulate(step, instant, plan::SimPolicy::planned, 4);
    if (!traffic.ok() || traffic.last().h2d_bytes == 0) return;
    model.h2d_bytes_per_s = model.d2h_bytes_per_s =
        static_cast<double>(traffic.last().h2d_bytes) * 1e9 / traffic.last().step_ns;
    const plan::SimResult planned = plan::simulate(step, model, plan::SimPolicy::planned, 4);
    const plan::StepBound bound = plan::step_bound(step, model);
    const std::optional<double> belady =
        simulated_step_vs_bound(step, model, plan::SimPolicy::belady, bound);
    if (!planned.ok() || !belady) continue;
    report_note(fmt::format("{:10} | {:8.1f} | {:4.2f} | {:13.3f} | {:18.3f} | {:17.3f}",
                            budget / kMiB, traffic.last().h2d_bytes / 1048576.0,
                            model.h2d_bytes_per_s / 1e9,
                            planned.last().stall_ns / planned.last().step_ns,
                            planned.last().step_ns / bound.bound_ns, *belady));
  }
}

// A planned run at `budget`, traced, and the simulator's stall on its own
// traced step at that budget, as a fraction of its step (nothing when the
// simulator cannot run that step at that budget).
struct HideableRun {
  ChildResult result;
  TracedStep traced;
  std::optional<double> sim_stall_fraction;

  bool hidden() const { return sim_stall_fraction && *sim_stall_fraction <= kHiddenStall; }
};

HideableRun run_hideable(const std::vector<std::string>& parent_args, const Options& options,
                         plan::CostModel model, std::uint64_t budget) {
  const std::string trace = trace_path("hideable");
  HideableRun run;
  run.result = run_in_child(with_budget(parent_args, fmt::format("{}", budget)), "planned",
                            model.h2d_bytes_per_s, trace);
  run.traced = read_traced_step(trace, last_step(options));
  model.device_budget = budget;
  const plan::SimResult simulated =
      plan::simulate(run.traced.step, model, plan::SimPolicy::planned, 4);
  if (simulated.ok()) run.sim_stall_fraction = simulated.last().stall_ns / simulated.last().step_ns;
  return run;
}

// Note [Where the stall goal applies]: searches from the measured run's
// traced step, then checks the budget found on the trace of the run made
// there, and searches on from that trace while the simulator does not hide
// the traffic on it.
void report_hideable(const Options& options, const std::vector<std::string>& parent_args,
                     const TracedStep& measured, plan::CostModel model) {
  std::optional<std::uint64_t> hideable = hideable_budget(measured.step, model);
  std::optional<HideableRun> run;
  for (int search = 0; hideable && search < kHideableSearches; ++search) {
    run = run_hideable(parent_args, options, model, *hideable);
    if (run->hidden()) break;
    report_note(fmt::format(
        "at {} MiB the simulator on the run's own traced step {}: not hidden; searching on from "
        "that trace",
        *hideable / kMiB,
        run->sim_stall_fraction
            ? fmt::format("expects a stall of {:.3f} of the step", *run->sim_stall_fraction)
            : std::string("cannot run (its ops need a larger budget)")));
    model.device_budget = *hideable;
    hideable = hideable_budget(run->traced.step, model);
  }
  if (!hideable) {
    report_note(
        "no budget between the measured one and the whole model's where the simulator hides "
        "the planned policy's traffic");
    return;
  }
  if (!run->hidden()) {
    report_note(fmt::format(
        "after {} searches the simulator does not hide the traffic on any run's own trace: "
        "no _hideable figures",
        kHideableSearches));
    return;
  }
  report_metric("train_hideable_budget_mib", static_cast<double>(*hideable) / 1048576.0, "MiB");
  const ChildResult& hidden = run->result;
  report_metric("train_hideable_h2d_mib_per_step", hidden.h2d_bytes / 1048576.0, "MiB");
  report_metric("train_step_ms_planned_hideable", hidden.step_ms, "ms");
  report_metric("train_stall_fraction_planned_hideable",
                hidden.stall_ms / (hidden.total_step_ms / options.steps), "ratio");
  report_metric("train_spill_wait_fraction_planned_hideable",
                hidden.spill_wait_ms / (hidden.total_step_ms / options.steps), "ratio");
  model.device_budget = *hideable;
  report_simulated(run->traced, model, "_hideable");
}

// The runs and the simulator; failures go to report_failure.
void measure(Options options, const std::vector<std::string>& parent_args) {
  options.budget = resolve_budget(options, parent_args);
  const std::optional<std::uint64_t> budget_bytes = detail::parse_size(options.budget);
  if (!budget_bytes)
    throw std::runtime_error(fmt::format(
        "--budget '{}': expected a size such as 48MiB or 50331648, or auto", options.budget));
  const std::vector<std::string> base_args = with_budget(parent_args, options.budget);
  report_metric("train_budget_mib", static_cast<double>(*budget_bytes) / 1048576.0, "MiB");
  // 1. Compute and traffic: instant copies.
  const ChildResult instant = run_in_child(base_args, "planned", 0, "-");
  const double bandwidth = instant.h2d_bytes / (instant.step_ms / 1e3);
  report_metric("train_compute_ms", instant.step_ms, "ms");
  report_metric("train_h2d_mib_per_step", instant.h2d_bytes / 1048576.0, "MiB");
  report_metric("train_sim_bandwidth_gbps", bandwidth / 1e9, "GB/s");
  if (bandwidth <= 0) {
    report_failure("no chunk traffic: the budget holds the model; lower --budget");
    return;
  }
  // 2. Both policies at that bandwidth; the planned run traced.
  const std::string trace = trace_path("planned");
  const ChildResult planned = run_in_child(base_args, "planned", bandwidth, trace);
  const ChildResult lru = run_in_child(base_args, "lru", bandwidth, "-");
  report_metric("train_step_ms_planned", planned.step_ms, "ms");
  report_metric("train_step_ms_lru", lru.step_ms, "ms");
  report_metric("train_stall_fraction_planned",
                planned.stall_ms / (planned.total_step_ms / options.steps), "ratio");
  report_metric("train_stall_fraction_lru", lru.stall_ms / (lru.total_step_ms / options.steps),
                "ratio");
  report_metric("train_stall_expected_fraction_planned",
                planned.expected_ms / (planned.total_step_ms / options.steps), "ratio");
  report_metric("train_spill_wait_fraction_planned",
                planned.spill_wait_ms / (planned.total_step_ms / options.steps), "ratio");
  report_metric("train_spill_wait_fraction_lru",
                lru.spill_wait_ms / (lru.total_step_ms / options.steps), "ratio");
  report_metric("train_step_vs_compute_planned", planned.step_ms / instant.step_ms, "ratio");
  // 3. The cost simulator on the traced step (the last one).
  const TracedStep traced = read_traced_step(trace, last_step(options));
  plan::CostModel model;
  model.chunk_size = traced.chunk_size;
  model.h2d_bytes_per_s = bandwidth;
  model.d2h_bytes_per_s = bandwidth;
  model.device_budget = std::max(*budget_bytes, plan::smallest_budget(traced.step, model));
  if (model.device_budget > *budget_bytes)
    report_note(fmt::format(
        "the simulator's ops need {:.1f} MiB (an op's chunks and its non-model peak, each "
        "over the whole op): it runs at that budget",
        static_cast<double>(model.device_budget) / 1048576.0));
  report_metric("train_sim_budget_mib", static_cast<double>(model.device_budget) / 1048576.0,
                "MiB");
  report_simulated(traced, model, "");
  report_budget_sweep(traced.step, model);
  // 4. Where the simulator hides the traffic: Note [Where the stall goal applies].
  report_hideable(options, parent_args, traced, model);
}

int run_parent(const Options& options, const std::vector<std::string>& base_args) {
  report_note(fmt::format("configuration: {}", configuration(options, "POLICY", 0, "-")));
  benchmark::RegisterBenchmark("train",
                               [options, base_args](benchmark::State& state) {
                                 for (auto _ : state) {
                                   try {
                                     measure(options, base_args);
                                   } catch (const std::exception& e) {
                                     state.SkipWithError(e.what());
                                   }
                                 }
                               })
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  return run_and_report();
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  std::vector<std::string> base_args(argv + 1, argv + argc);
  initialize(&argc, argv);
  Options options;
  std::vector<std::string> child;
  CLI::App app{"bench_train: stall and step time of the demo's GPT on the simulated device"};
  app.add_option("--steps", options.steps, "timed steps per run")->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "untimed steps first")->check(CLI::PositiveNumber);
  app.add_option("--budget", options.budget, "device budget (activations and chunks)");
  app.add_option("--chunk-size", options.chunk_size, "chunk size");
  app.add_option("--threads", options.threads, "torch's intra-op threads per run")
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", options.trainer.model.layers, "transformer blocks");
  app.add_option("--d-model", options.trainer.model.d_model, "model width");
  app.add_option("--batch", options.trainer.batch, "sequences per step");
  app.add_option("--seq", options.trainer.model.sequence, "sequence length");
  std::string optimizer = "torch-adam";
  app.add_option("--optimizer", optimizer,
                 "the demo's optimizer: torch-adam (the default) or spillway-adam");
  app.add_option("--child", child, "internal: POLICY BANDWIDTH TRACE, one run")->expected(3);
  CLI11_PARSE(app, argc, argv);
  try {
    options.trainer.optimizer = spillway::train_demo::parse_optimizer(optimizer);
    if (!child.empty()) return run_child(options, child[0], std::stod(child[1]), child[2]);
    return run_parent(options, base_args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train: {}\n", e.what());
    return 2;
  }
}
