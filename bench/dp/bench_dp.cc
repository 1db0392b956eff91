// bench_dp: data parallel training on this machine (docs/benchmarks.md,
// docs/data-parallel.md). Runs spillway-train-demo at N = 1, 2 and 4 ranks
// (Gloo on the loopback, the simulated device with a modelled bandwidth and a
// budget that spills) on a GPT large enough to fill many chunks, reads each
// run's --figures, and prints:
//   dp_comm_bytes_vs_min_N          what each rank sent and received per step
//                                   over the minimum, 2(N-1)/N of the
//                                   parameter bytes plus as much of the
//                                   gradient bytes (the worst rank)
//   dp_state_bytes_per_rank_ratio_N optimizer-state bytes on a rank times N,
//                                   over the model's (the worst rank)
//   dp_step_scaling_2               median step time at N = 2 with half the
//                                   batch per rank, over N = 1 (one intra-op
//                                   thread per rank: 0.5 is perfect scaling)
//   dp_backward_overlap_2           median step time at N = 2 reducing each
//                                   chunk group during backward, over the
//                                   same reducing after backward
//                                   (--reduce-after-backward)
// and with dist_params:sharded (docs/data-parallel.md, "Sharded parameters"):
//   dp_param_bytes_per_rank_ratio_sharded_N  parameter chunk bytes a rank
//                                   holds between steps times N, over the
//                                   model's (the worst rank)
//   dp_comm_bytes_vs_min_sharded_N  what each rank sent and received per
//                                   step over ZeRO-3's minimum, (N-1)/N of
//                                   the parameters twice (forward and
//                                   backward) plus of the gradients
//   dp_step_sharded_vs_replicated_N median step time sharded over replicated
//   dp_gathers_ahead_fraction_sharded_N  of the parameter gathers of the
//                                   run (its first step's on demand
//                                   included), those issued ahead of their
//                                   use by the plan (the least rank's)
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bench/common/metric_reporter.h"

namespace spillway::bench {
namespace {

// 8 blocks of width 512: 25.5M parameters, about 50 parameter chunks of
// 2 MiB, so that whole-chunk ownership splits the state to within a few
// percent at N = 4. The budget holds about half the model data.
constexpr const char* kConf =
    "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:192MiB,sim_capacity:1GiB,"
    "sim_bandwidth:4GB/s,policy:planned";

struct Options {
  int steps = 4;
  int batch = 8;  // at N = 1; each of N ranks trains batch / N
  std::string model = "--layers 8 --d-model 512 --heads 8 --seq 64 --vocab 256";
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A temporary folder for the runs' figures and logs, removed at the end.
struct Folder {
  Folder() {
    char pattern[] = "/tmp/spillway-bench-dp-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~Folder() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string path;
};

// The demo's figures for `ranks` ranks; throws with the run's output when it fails.
// `extra`: more of the demo's options; `more_conf`: more configuration.
nlohmann::json run_demo(const Options& options, int ranks, const Folder& folder,
                        const std::string& extra = "", const std::string& more_conf = "") {
  const std::string name = fmt::format("n{}{}{}", ranks, extra.empty() ? "" : "-extra",
                                       more_conf.empty() ? "" : "-conf");
  const std::string figures = fmt::format("{}/{}.json", folder.path, name);
  const std::string log = fmt::format("{}/{}.log", folder.path, name);
  const std::string command = fmt::format(
      "OMP_NUM_THREADS=1 SPILLWAY_CONF='{}' '{}' {} --nproc {} --batch {} --steps {} "
      "--optimizer spillway-adam {} --figures '{}' > '{}' 2>&1",
      std::string(kConf) + more_conf, SPILLWAY_TRAIN_DEMO, options.model, ranks,
      options.batch / ranks, options.steps, extra, figures, log);
  if (std::system(command.c_str()) != 0)
    throw std::runtime_error(fmt::format("spillway-train-demo --nproc {} failed; its output:\n{}",
                                         ranks, read_text(log)));
  return nlohmann::json::parse(read_text(figures));
}

// The largest of a figure over the ranks.
double worst(const nlohmann::json& figures, const auto& figure) {
  double value = 0;
  for (const nlohmann::json& rank : figures.at("per_rank")) value = std::max(value, figure(rank));
  return value;
}

double least(const nlohmann::json& figures, const auto& figure) {
  double value = std::numeric_limits<double>::infinity();
  for (const nlohmann::json& rank : figures.at("per_rank")) value = std::min(value, figure(rank));
  return value;
}

Options g_options;

// One iteration: the four runs; their figures become metric lines.
void BM_DataParallel(benchmark::State& state) {
  const Options& options = g_options;
  for (auto _ : state) {
    try {
      Folder folder;
      const nlohmann::json one = run_demo(options, 1, folder);
      const auto step_ms = [](const nlohmann::json& r) {
        return r.at("step_ms_median").get<double>();
      };
      const double one_ms = worst(one, step_ms);
      for (const int ranks : {2, 4}) {
        const nlohmann::json figures = run_demo(options, ranks, folder);
        const double traffic = worst(figures, [](const nlohmann::json& r) {
          return (r.at("bytes_sent_per_step").get<double>() +
                  r.at("bytes_received_per_step").get<double>()) /
                 (2 * r.at("minimum_bytes_each_way_per_step").get<double>());
        });
        const double share = worst(figures, [&](const nlohmann::json& r) {
          return r.at("optimizer_state_bytes").get<double>() * ranks /
                 r.at("model_optimizer_state_bytes").get<double>();
        });
        report_metric(fmt::format("dp_comm_bytes_vs_min_{}", ranks), traffic, "ratio");
        report_metric(fmt::format("dp_state_bytes_per_rank_ratio_{}", ranks), share, "ratio");
        if (ranks == 2) {
          const double ms = worst(figures, step_ms);
          report_note(
              fmt::format("median step: {:.0f} ms at N = 1, {:.0f} ms at N = 2", one_ms, ms));
          report_metric("dp_step_scaling_2", ms / one_ms, "ratio");
          const double after_ms =
              worst(run_demo(options, ranks, folder, "--reduce-after-backward"), step_ms);
          report_note(fmt::format(
              "median step at N = 2: {:.0f} ms reducing during backward, {:.0f} ms after it", ms,
              after_ms));
          report_metric("dp_backward_overlap_2", ms / after_ms, "ratio");
        }
        const nlohmann::json sharded = run_demo(options, ranks, folder, "", ",dist_params:sharded");
        report_metric(fmt::format("dp_param_bytes_per_rank_ratio_sharded_{}", ranks),
                      worst(sharded,
                            [&](const nlohmann::json& r) {
                              return r.at("parameter_chunk_bytes_held").get<double>() * ranks /
                                     r.at("parameter_chunk_bytes").get<double>();
                            }),
                      "ratio");
        report_metric(fmt::format("dp_comm_bytes_vs_min_sharded_{}", ranks),
                      worst(sharded,
                            [&](const nlohmann::json& r) {
                              const double minimum = (2 * r.at("parameter_bytes").get<double>() +
                                                      r.at("gradient_bytes").get<double>()) *
                                                     (ranks - 1) / ranks;
                              return (r.at("bytes_sent_per_step").get<double>() +
                                      r.at("bytes_received_per_step").get<double>()) /
                                     (2 * minimum);
                            }),
                      "ratio");
        report_metric(fmt::format("dp_step_sharded_vs_replicated_{}", ranks),
                      worst(sharded, step_ms) / worst(figures, step_ms), "ratio");
        report_metric(fmt::format("dp_gathers_ahead_fraction_sharded_{}", ranks),
                      least(sharded,
                            [](const nlohmann::json& r) {
                              return r.at("parameter_gathers_ahead_per_step").get<double>() /
                                     std::max(r.at("parameter_gathers_per_step").get<double>(),
                                              1.0);
                            }),
                      "ratio");
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  }
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  initialize(&argc, argv);
  Options& options = g_options;
  CLI::App app{
      "bench_dp: data parallel traffic, state split and step scaling (spillway-train-demo)"};
  app.add_option("--steps", options.steps, "training steps per run")->check(CLI::PositiveNumber);
  app.add_option("--batch", options.batch, "sequences per step at N = 1 (a multiple of 4)")
      ->check(CLI::PositiveNumber);
  app.add_option("--model", options.model, "the demo's model options");
  CLI11_PARSE(app, argc, argv);
  if (options.batch % 4 != 0) {
    fmt::print(stderr, "bench_dp: --batch {} does not split over 4 ranks\n", options.batch);
    return 2;
  }
  report_note(fmt::format("configuration: {}; model: {}; batch {} split over the ranks; {} steps",
                          kConf, options.model, options.batch, options.steps));
  benchmark::RegisterBenchmark("data_parallel", BM_DataParallel)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
  return run_and_report();
}
