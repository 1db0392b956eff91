// bench_planner: simulates 10 training steps of three GPT-style models
// (tools/sim's generator; docs/planner.md) on an H200-like cost model
// (55 GB/s each way, 64 MiB chunks) and prints, per case,
//
//   metric planned_vs_belady_bytes_<case>  planned bytes moved / offline Belady's,
//                                          all steps (the traced warmup step, run
//                                          under LRU, included)
//   metric planned_vs_belady_bytes_steady_<case>  the same over the steady steps
//                                          only (the warmup step left out of both
//                                          sides); goal <= 1.02
//   metric planned_vs_lru_bytes_<case>     planned bytes moved / LRU's (printed; its
//                                          old 0.70 goal is retired: every chunk is
//                                          written every step, docs/planner.md)
//   metric sim_step_vs_bound_<case>        planned steady step time / lower bound
//   metric sim_fastest_step_vs_bound_<case>  the fastest plan the simulator knows
//                                          (fastest_plan.h) / the same bound
//
// The planned policy is simulate()'s default: headroom chosen per trace.
//
// and the headline metrics planned_vs_belady_bytes, planned_vs_belady_bytes_steady,
// planned_vs_lru_bytes (the worst case of the three) and sim_step_vs_bound (gpt_1300m_x3, whose
// model data is 3x the device budget; goal <= 1.15). Google Benchmark times the
// planner itself (plan_steady) per case.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/common/metric_reporter.h"
#include "bench/common/step_bound_note.h"
#include "tools/sim/model_description.h"
#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/fastest_plan.h"
#include "tracer/planner/planner.h"

namespace {

using namespace spillway;

constexpr std::size_t kSteps = 10;
constexpr std::uint64_t kChunk = 64ull << 20;

struct Case {
  std::string name;
  sim::GptSpec gpt;
  double model_over_budget;  // model data / device budget
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"gpt_125m_x2", {12, 768, 512, 1}, 2.0},
      {"gpt_350m_x3", {24, 1024, 512, 1}, 3.0},
      {"gpt_1300m_x3", {24, 2048, 512, 1}, 3.0},
  };
  return all;
}

plan::CostModel cost_model(const sim::ModelSpec& model, double model_over_budget) {
  const auto budget =
      static_cast<std::uint64_t>(static_cast<double>(model.model_bytes()) / model_over_budget);
  return {budget, kChunk, 0, 55e9, 55e9};
}

// Bytes moved in steps [first, kSteps).
double moved_from(const plan::SimResult& result, std::size_t first) {
  const plan::StepCost sum = result.total(first, kSteps);
  return static_cast<double>(sum.h2d_bytes + sum.d2h_bytes);
}

double moved(const plan::SimResult& result) { return moved_from(result, 0); }

// Note [Belady's run ends a step later]
// The planned policy plans every step for a next one (its Belady looks
// into the next repetition), so its last step writes back what the next
// step's room needs. Offline Belady over exactly kSteps steps knows the run
// ends there: its last step keeps dirty chunks it will never evict (19 of
// 220 write-backs fewer on gpt_1300m_x3), and the comparison charged that
// end to the planned policy. So Belady runs one step more, and the first
// kSteps of its run are counted: the reference sees the same horizon.

double worst_belady = 0, worst_belady_steady = 0, worst_lru = 0;

void run_case(benchmark::State& state, const Case& c) {
  const sim::ModelSpec model = sim::gpt_model(c.gpt);
  const plan::StepTrace trace = sim::step_trace(model, kChunk);
  const plan::CostModel cost = cost_model(model, c.model_over_budget);
  for (auto _ : state) benchmark::DoNotOptimize(plan::plan_steady(trace, cost));

  const plan::SimResult planned = plan::simulate(trace, cost, plan::SimPolicy::planned, kSteps);
  const plan::SimResult lru = plan::simulate(trace, cost, plan::SimPolicy::lru, kSteps);
  // Note [Belady's run ends a step later].
  const plan::SimResult belady = plan::simulate(trace, cost, plan::SimPolicy::belady, kSteps + 1);
  for (const plan::SimResult* result : {&planned, &lru, &belady}) {
    if (!result->ok()) {
      state.SkipWithError(result->error.c_str());
      return;
    }
  }
  const plan::StepBound bound = plan::step_bound(trace, cost);
  const double vs_belady = moved(planned) / moved(belady);
  // Step 0 is the traced warmup step (LRU's under the planned policy).
  const double vs_belady_steady = moved_from(planned, 1) / moved_from(belady, 1);
  const double vs_lru = moved(planned) / moved(lru);
  const double vs_bound = planned.last().step_ns / bound.bound_ns;
  worst_belady = std::max(worst_belady, vs_belady);
  worst_belady_steady = std::max(worst_belady_steady, vs_belady_steady);
  worst_lru = std::max(worst_lru, vs_lru);
  state.counters["ops"] = static_cast<double>(trace.ops.size());
  bench::report_note(fmt::format("{}: {}", c.name, bench::step_bound_note(bound)));
  bench::report_metric("planned_vs_belady_bytes_" + c.name, vs_belady, "ratio");
  bench::report_metric("planned_vs_belady_bytes_steady_" + c.name, vs_belady_steady, "ratio");
  bench::report_metric("planned_vs_lru_bytes_" + c.name, vs_lru, "ratio");
  bench::report_metric("sim_step_vs_bound_" + c.name, vs_bound, "ratio");
  bench::report_metric("sim_planned_stall_ms_" + c.name, planned.last().stall_ns / 1e6, "ms");
  bench::report_metric("sim_lru_step_vs_bound_" + c.name, lru.last().step_ns / bound.bound_ns,
                       "ratio");
  bench::report_metric("planned_vs_belady_bytes", worst_belady, "ratio");
  bench::report_metric("planned_vs_belady_bytes_steady", worst_belady_steady, "ratio");
  bench::report_metric("planned_vs_lru_bytes", worst_lru, "ratio");
  if (c.name == "gpt_1300m_x3") bench::report_metric("sim_step_vs_bound", vs_bound, "ratio");

  // The trade-off of PlanOptions::prefetch_reserve: 2 chunks kept free for
  // prefetches move more bytes but overlap more (docs/planner.md). Headroom
  // choice off, so this stays Belady plus the reserve alone.
  const plan::SimResult reserved =
      plan::simulate(trace, cost, plan::SimPolicy::planned, kSteps,
                     {.prefetch_reserve = 2, .choose_headroom = false});
  if (reserved.ok()) {
    bench::report_metric("reserve2_planned_vs_belady_bytes_" + c.name,
                         moved(reserved) / moved(belady), "ratio");
    bench::report_metric("reserve2_sim_step_vs_bound_" + c.name,
                         reserved.last().step_ns / bound.bound_ns, "ratio");
  }

  // The best step the simulator knows, over the planner's options: how far
  // the bound can be from the best step (tracer/planner/fastest_plan.h).
  const plan::FastestPlan fastest = plan::fastest_known_plan(trace, cost);
  bench::report_note(fmt::format("{}: fastest known plan: {}", c.name, fastest.describe()));
  bench::report_metric("sim_fastest_step_vs_bound_" + c.name,
                       fastest.steady_step_ns / bound.bound_ns, "ratio");
}

}  // namespace

int main(int argc, char** argv) {
  bench::initialize(&argc, argv);
  for (const Case& c : cases()) {
    benchmark::RegisterBenchmark(("plan_steady/" + c.name).c_str(),
                                 [&c](benchmark::State& state) { run_case(state, c); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  return bench::run_and_report();
}
