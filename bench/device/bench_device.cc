// bench_device: what the device seam's operations cost, as metric lines.
//
// On SimDevice: copy throughput against its modelled bandwidth (does the
// simulation deliver the bandwidth the planner will assume?), copy throughput
// at memcpy speed, and event latencies. On CudaDevice, when a GPU is usable:
// pinned host-to-device and device-to-host throughput and event latencies.
// docs/benchmarks.md defines every metric.
//
//   bench_device [--device=auto|sim|cuda|all] [--sim_bandwidth_gbps=X]
//                [--sim_copy_mib=N] [--cuda_copy_mib=N] [--benchmark_* flags]
//
// --device=auto (default) runs sim, and cuda when CudaDevice::probe says a GPU
// is usable ("# cuda: skipped (<reason>)" otherwise). --device=cuda or all
// make the GPU required: without one the program prints the reason and exits 1.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/device/sim_device.h"
#include "bench/common/metric_reporter.h"
#include "bench/device/device_benchmarks.h"
#if SPILLWAY_HAVE_CUDA
#include "allocator/device/cuda_device.h"
#endif

namespace spillway::bench {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Options {
  bool run_sim = true;
  bool run_cuda = false;
  bool cuda_required = false;
  // Below host memcpy speed on any machine we run on (3.5 GB/s and up for
  // 64 MiB here), so the ratio measures the simulation's pacing; a modelled
  // bandwidth above memcpy speed cannot be delivered (docs/benchmarks.md).
  double sim_bandwidth_gbps = 2;
  std::size_t sim_copy_bytes = 64 * kMiB;
  // Large enough that a PCIe/C2C copy lasts milliseconds, past launch costs.
  std::size_t cuda_copy_bytes = 256 * kMiB;
};

void print_usage() {
  std::cout << "usage: bench_device [--device=auto|sim|cuda|all] [--sim_bandwidth_gbps=X]\n"
               "                    [--sim_copy_mib=N] [--cuda_copy_mib=N] [--benchmark_* flags]\n";
}

bool parse_options(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value_of = [&](std::string_view flag) -> const char* {
      return arg.substr(0, flag.size()) == flag ? argv[i] + flag.size() : nullptr;
    };
    if (const char* device = value_of("--device=")) {
      const std::string_view choice = device;
      options->run_sim = choice == "auto" || choice == "sim" || choice == "all";
      options->run_cuda = choice == "auto" || choice == "cuda" || choice == "all";
      options->cuda_required = choice == "cuda" || choice == "all";
      if (!options->run_sim && !options->run_cuda) {
        std::cerr << "bench_device: --device must be auto, sim, cuda or all, not '" << choice
                  << "'\n";
        return false;
      }
    } else if (const char* gbps = value_of("--sim_bandwidth_gbps=")) {
      options->sim_bandwidth_gbps = std::strtod(gbps, nullptr);
      if (!(options->sim_bandwidth_gbps > 0)) {
        std::cerr << "bench_device: --sim_bandwidth_gbps must be > 0\n";
        return false;
      }
    } else if (const char* mib = value_of("--sim_copy_mib=")) {
      options->sim_copy_bytes = std::strtoull(mib, nullptr, 10) * kMiB;
    } else if (const char* mib = value_of("--cuda_copy_mib=")) {
      options->cuda_copy_bytes = std::strtoull(mib, nullptr, 10) * kMiB;
    } else {
      if (arg != "--help" && arg != "-h") std::cerr << "bench_device: unknown flag " << arg << "\n";
      print_usage();
      return false;
    }
  }
  if (options->sim_copy_bytes == 0 || options->cuda_copy_bytes == 0) {
    std::cerr << "bench_device: copy sizes must be at least 1 MiB\n";
    return false;
  }
  return true;
}

// Everything the registered benchmarks point at; it outlives them.
struct BenchmarkState {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<DeviceFixture>> fixtures;  // destroyed before devices

  ~BenchmarkState() { fixtures.clear(); }

  DeviceFixture* add(std::unique_ptr<Device> device, std::size_t copy_bytes) {
    std::string error;
    auto fixture = DeviceFixture::create(*device, copy_bytes, &error);
    devices.push_back(std::move(device));
    if (fixture == nullptr) {
      report_failure(devices.back()->name() + ": setup failed: " + error);
      return nullptr;
    }
    fixtures.push_back(std::move(fixture));
    return fixtures.back().get();
  }
};

void register_copy(const std::string& name, DeviceFixture* fixture, CopyBenchmark spec) {
  benchmark::RegisterBenchmark(
      name.c_str(),
      [fixture, spec](benchmark::State& state) { run_copy_benchmark(state, *fixture, spec); })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void register_event(const std::string& name, DeviceFixture* fixture, bool cross_stream,
                    bool behind_host_function, const std::string& metric) {
  benchmark::RegisterBenchmark(
      name.c_str(),
      [=](benchmark::State& state) {
        if (cross_stream) {
          run_cross_stream_event_benchmark(state, *fixture, behind_host_function, metric);
        } else {
          run_event_roundtrip_benchmark(state, *fixture, behind_host_function, metric);
        }
      })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

void register_sim(const Options& options, BenchmarkState& owned) {
  const double modelled_bytes_per_s = options.sim_bandwidth_gbps * 1e9;
  SimDeviceOptions modelled;
  modelled.capacity_bytes = 2 * options.sim_copy_bytes + 64 * kMiB;
  modelled.bandwidth_bytes_per_s = modelled_bytes_per_s;
  SimDeviceOptions unmodelled = modelled;
  unmodelled.bandwidth_bytes_per_s = 0;

  if (DeviceFixture* fixture =
          owned.add(std::make_unique<SimDevice>(modelled), options.sim_copy_bytes)) {
    char bandwidth[32];
    std::snprintf(bandwidth, sizeof bandwidth, "%g", options.sim_bandwidth_gbps);
    report_note("sim: " + fixture->device().name() + ", modelled bandwidth " + bandwidth +
                " GB/s, " + std::to_string(options.sim_copy_bytes / kMiB) + " MiB per copy");
    register_copy("sim/copy_h2d_modelled", fixture,
                  {CopyDirection::host_to_device, "sim_copy_throughput", modelled_bytes_per_s,
                   "sim_copy_vs_modelled_bw"});
  }
  if (DeviceFixture* fixture =
          owned.add(std::make_unique<SimDevice>(unmodelled), options.sim_copy_bytes)) {
    register_copy("sim/copy_h2d_unmodelled", fixture,
                  {CopyDirection::host_to_device, "sim_copy_unmodelled_throughput", 0, ""});
    register_event("sim/event_roundtrip", fixture, false, false, "sim_event_roundtrip_ns");
    register_event("sim/stream_roundtrip", fixture, false, true, "sim_stream_roundtrip_ns");
    register_event("sim/cross_stream_event", fixture, true, true, "sim_cross_stream_event_ns");
  }
}

// Returns false when the GPU was required and is not usable.
bool register_cuda(const Options& options, BenchmarkState& owned) {
#if SPILLWAY_HAVE_CUDA
  std::string reason;
  std::unique_ptr<CudaDevice> device;
  if (CudaDevice::probe(&reason) && CudaDevice::create(0, &device) != Status::ok) {
    reason = CudaDevice::thread_last_error();
  }
#else
  const std::string reason = "spillway was built without the CUDA backend";
  std::unique_ptr<Device> device;
#endif
  if (device == nullptr) {
    report_note("cuda: skipped (" + reason + ")");
    return !options.cuda_required;
  }
  report_note("cuda: " + device->name() + ", " + std::to_string(options.cuda_copy_bytes / kMiB) +
              " MiB per copy, pinned host memory");
  DeviceFixture* fixture = owned.add(std::move(device), options.cuda_copy_bytes);
  if (fixture == nullptr) return false;
  register_copy("cuda/copy_h2d", fixture,
                {CopyDirection::host_to_device, "cuda_h2d_throughput", 0, ""});
  register_copy("cuda/copy_d2h", fixture,
                {CopyDirection::device_to_host, "cuda_d2h_throughput", 0, ""});
  register_event("cuda/event_roundtrip", fixture, false, false, "cuda_event_roundtrip_ns");
  register_event("cuda/cross_stream_event", fixture, true, false, "cuda_cross_stream_event_ns");
  register_event("cuda/host_function_roundtrip", fixture, false, true,
                 "cuda_host_function_roundtrip_ns");
  return true;
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  using namespace spillway::bench;
  initialize(&argc, argv);
  Options options;
  if (!parse_options(argc, argv, &options)) return 2;

  BenchmarkState owned;
  if (options.run_sim) register_sim(options, owned);
  if (options.run_cuda && !register_cuda(options, owned)) {
    report_failure("--device asked for cuda, and no GPU is usable");
  }
  return run_and_report();
}
