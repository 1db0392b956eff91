// The command line shared by benchmark programs that run on a device:
//
//   --device=auto|sim|cuda|all   auto: sim, and cuda when a GPU is usable;
//                                cuda/all: a GPU is required
//   --sim_bandwidth_gbps=X       SimDevice's modelled copy speed
//
// Parsed with CLI11 after spillway::bench::initialize() has taken the
// --benchmark_* flags; each program adds its own options to the same app.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace spillway::bench {

struct DeviceOptions {
  bool run_sim = true;
  bool run_cuda = true;
  bool cuda_required = false;
  // Below host memcpy speed on any machine we run on (3.5 GB/s and up for
  // 64 MiB here), so a ratio measures the simulation's pacing: a modelled
  // bandwidth above memcpy speed cannot be delivered (docs/benchmarks.md).
  double sim_bandwidth_gbps = 2;
};

// Adds --device and --sim_bandwidth_gbps to `app`, writing into `options`.
void add_device_options(CLI::App& app, DeviceOptions* options);

// Parses argv with `app`. Returns -1 when the program should run, else the
// exit code (0 after --help, 2 after a bad flag, the message printed).
int parse_command_line(CLI::App& app, int argc, char** argv);

}  // namespace spillway::bench
