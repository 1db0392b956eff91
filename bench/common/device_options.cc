#include "bench/common/device_options.h"

namespace spillway::bench {

void add_device_options(CLI::App& app, DeviceOptions* options) {
  app.add_option_function<std::string>(
         "--device",
         [options](const std::string& choice) {
           options->run_sim = choice != "cuda";
           options->run_cuda = choice != "sim";
           options->cuda_required = choice == "cuda" || choice == "all";
         },
         "auto (sim, and cuda when a GPU is usable), sim, cuda or all (cuda required)")
      ->check(CLI::IsMember({"auto", "sim", "cuda", "all"}));
  app.add_option("--sim_bandwidth_gbps", options->sim_bandwidth_gbps,
                 "SimDevice's modelled copy bandwidth in GB/s")
      ->check(CLI::PositiveNumber);
}

int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;  // CLI11's own codes mean nothing to scripts
  }
  return -1;
}

}  // namespace spillway::bench
