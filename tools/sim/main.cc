// spillway-sim: simulates N training steps of a synthetic model under the
// planned, lru and static policies (and offline Belady as the reference) and
// prints, per policy, bytes moved each way, stall time and step time beside
// the lower bound max(compute, bytes that must move / bandwidth), as text
// and as `metric NAME VALUE UNIT` lines.
//
//   spillway-sim model.json --budget 8GB
//   spillway-sim --gpt 24,2048,1024,8 --model-over-budget 3
//
// Exit status: 0 simulated (a policy that cannot run is reported, not an
// error); 1 the description cannot be read or nothing fits; CLI11's codes
// for bad flags.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <functional>
#include <string>

#include "allocator/config/options.h"
#include "tools/common/positive_finite.h"
#include "tools/common/tool_main.h"
#include "tools/sim/model_description.h"
#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/fastest_plan.h"
#include "tracer/planner/planner.h"

namespace {

using namespace spillway;

std::function<std::string(std::string&)> size_validator(std::uint64_t* out) {
  return [out](std::string& text) -> std::string {
    const auto bytes = detail::parse_size(text);
    if (!bytes) return "'" + text + "' is not a size such as 64MB (B, KB, MB, GB, KiB, MiB, GiB)";
    *out = *bytes;
    return "";
  };
}

void print_result(const plan::SimResult& result, const plan::StepBound& bound) {
  const std::string name(plan::policy_name(result.policy));
  if (!result.ok()) {
    fmt::print("{:8} cannot run: {}\n", name, result.error);
    return;
  }
  const plan::StepCost& last = result.last();
  const plan::StepCost total = result.total();
  fmt::print(
      "{:8} last step: {:.3f} ms (stall {:.3f} ms, spill waits {:.3f} ms, {:.3f}x bound), h2d "
      "{:.1f} MB, d2h {:.1f} MB; all steps: h2d {:.1f} MB, d2h {:.1f} MB, stall {:.3f} ms\n",
      name, last.step_ns / 1e6, last.stall_ns / 1e6, last.spill_wait_ns / 1e6,
      last.step_ns / bound.bound_ns, last.h2d_bytes / 1e6, last.d2h_bytes / 1e6,
      total.h2d_bytes / 1e6, total.d2h_bytes / 1e6, total.stall_ns / 1e6);
  fmt::print("metric sim_{}_step_ns {:.0f} ns\n", name, last.step_ns);
  fmt::print("metric sim_{}_stall_ns {:.0f} ns\n", name, last.stall_ns);
  fmt::print("metric sim_{}_spill_wait_ns {:.0f} ns\n", name, last.spill_wait_ns);
  fmt::print("metric sim_{}_h2d_bytes {} bytes\n", name, total.h2d_bytes);
  fmt::print("metric sim_{}_d2h_bytes {} bytes\n", name, total.d2h_bytes);
  fmt::print("metric sim_{}_step_vs_bound {:.4f} ratio\n", name, last.step_ns / bound.bound_ns);
}

}  // namespace

namespace {

int tool_main(int argc, char** argv) {
  CLI::App app{"Simulates training steps of a synthetic model under spillway's policies."};
  std::string model_path;
  std::vector<std::uint64_t> gpt;
  std::string budget_text = "0", chunk_text = "64MiB", margin_text = "0";
  std::uint64_t budget = 0, chunk_size = 64ull << 20, margin = 0;
  double over_budget = 0, h2d_gbps = 55, d2h_gbps = 0;
  std::size_t steps = 4;
  spillway::plan::PlanOptions plan_options;
  std::string policy = "all";
  app.add_option("MODEL", model_path, "model description (JSON; docs/planner.md)");
  app.add_option("--gpt", gpt, "GPT generator instead of a file: N_LAYERS,D_MODEL,SEQ,BATCH")
      ->delimiter(',')
      ->expected(4)
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));
  app.add_option("--budget", budget_text, "device budget")
      ->check(CLI::Validator(size_validator(&budget), "SIZE"));
  app.add_option("--model-over-budget", over_budget,
                 "instead of --budget: budget = model data / this")
      ->check(spillway::positive_finite());
  app.add_option("--chunk-size", chunk_text, "chunk size")
      ->check(CLI::Validator(size_validator(&chunk_size), "SIZE"))
      ->capture_default_str();
  app.add_option("--margin", margin_text, "budget kept free besides activations")
      ->check(CLI::Validator(size_validator(&margin), "SIZE"));
  app.add_option("--h2d-gbps", h2d_gbps, "host-to-device bandwidth, GB/s")
      ->check(spillway::positive_finite())
      ->capture_default_str();
  app.add_option("--d2h-gbps", d2h_gbps, "device-to-host bandwidth, GB/s (default: h2d's)")
      ->check(spillway::positive_finite());
  app.add_option("--steps", steps, "steps to simulate")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--prefetch-reserve", plan_options.prefetch_reserve,
                 "planned: chunks of each moment kept free for prefetches")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--policy", policy, "planned, lru, static, belady or all")
      ->check(CLI::IsMember({"planned", "lru", "static", "belady", "all"}))
      ->capture_default_str();
  bool fastest = false;
  app.add_flag("--fastest", fastest,
               "also the fastest plan the simulator knows (the planner's prefetch reserves and "
               "headrooms, and offline Belady; tracer/planner/fastest_plan.h)");
  CLI11_PARSE(app, argc, argv);

  try {
    sim::ModelSpec model;
    if (!gpt.empty()) {
      model = sim::gpt_model({gpt[0], gpt[1], gpt[2], gpt[3]});
    } else if (!model_path.empty()) {
      model = sim::load_model(model_path);
    } else {
      std::fprintf(stderr, "spillway-sim: give a MODEL file or --gpt\n");
      return 2;
    }
    if (chunk_size == 0 || steps == 0) {
      std::fprintf(stderr, "spillway-sim: --chunk-size and --steps must be positive\n");
      return 2;
    }
    const plan::StepTrace trace = sim::step_trace(model, chunk_size);
    std::uint64_t peak_activations = 0;
    for (const plan::TracedOp& op : trace.ops) {
      peak_activations = std::max(peak_activations, op.non_model_bytes);
    }
    if (over_budget > 0) {
      budget = static_cast<std::uint64_t>(static_cast<double>(model.model_bytes()) / over_budget);
    }
    if (budget == 0) {
      std::fprintf(stderr, "spillway-sim: give --budget or --model-over-budget\n");
      return 2;
    }
    const plan::CostModel cost{budget, chunk_size, margin, h2d_gbps * 1e9,
                               (d2h_gbps > 0 ? d2h_gbps : h2d_gbps) * 1e9};
    const plan::StepBound bound = plan::step_bound(trace, cost);
    fmt::print(
        "{}: {} layers, {} ops, model data {:.1f} MB, peak activations {:.1f} MB, budget "
        "{:.1f} MB, chunk {:.1f} MB\n",
        model.name, model.layers.size(), trace.ops.size(), model.model_bytes() / 1e6,
        peak_activations / 1e6, budget / 1e6, chunk_size / 1e6);
    fmt::print(
        "bound per step: {:.3f} ms = max(compute {:.3f} ms, h2d {:.1f} MB, d2h {:.1f} MB at "
        "the copy bandwidth: {:.3f} ms; the copies room forces into stretches of the step: "
        "{:.3f} ms)\n",
        bound.bound_ns / 1e6, bound.compute_ns / 1e6, bound.h2d_bytes / 1e6, bound.d2h_bytes / 1e6,
        bound.flat_ns / 1e6, bound.room_ns / 1e6);
    fmt::print("metric sim_bound_ns {:.0f} ns\n", bound.bound_ns);
    for (plan::SimPolicy p : {plan::SimPolicy::planned, plan::SimPolicy::lru,
                              plan::SimPolicy::static_residency, plan::SimPolicy::belady}) {
      if (policy != "all" && policy != plan::policy_name(p)) continue;
      print_result(plan::simulate(trace, cost, p, steps, plan_options), bound);
    }
    if (fastest) {
      const plan::FastestPlan best = plan::fastest_known_plan(trace, cost, steps);
      fmt::print("fastest known plan: {}: mean steady step {:.3f} ms ({:.3f}x bound)\n",
                 best.describe(), best.steady_step_ns / 1e6, best.steady_step_ns / bound.bound_ns);
      fmt::print("metric sim_fastest_step_ns {:.0f} ns\n", best.steady_step_ns);
      fmt::print("metric sim_fastest_step_vs_bound {:.4f} ratio\n",
                 best.steady_step_ns / bound.bound_ns);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "spillway-sim: %s\n", error.what());
    return 1;
  }
  return 0;
}

}  // namespace

// Note [A tool fails out loud] (tools/common/tool_main.h).
int main(int argc, char** argv) {
  return spillway::run_tool("spillway-sim", [&] { return tool_main(argc, argv); });
}
