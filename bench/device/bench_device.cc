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
#include "bench/common/device_options.h"
#include "bench/common/metric_reporter.h"
#include "bench/device/device_benchmarks.h"
#if SPILLWAY_HAVE_CUDA
#include "allocator/device/cuda_device.h"
#endif

namespace spillway::bench {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Options {
  DeviceOptions device;
  std::size_t sim_copy_bytes = 64 * kMiB;
  // Large enough that a PCIe/C2C copy lasts milliseconds, past launch costs.
  std::size_t cuda_copy_bytes = 256 * kMiB;
};

// Returns -1 to run, else the exit code.
int parse_options(int argc, char** argv, Options* options) {
  CLI::App app{"bench_device: what the device seam's operations cost, as metric lines"};
  add_device_options(app, &options->device);
  int sim_copy_mib = static_cast<int>(options->sim_copy_bytes / kMiB);
  int cuda_copy_mib = static_cast<int>(options->cuda_copy_bytes / kMiB);
  app.add_option("--sim_copy_mib", sim_copy_mib, "bytes per SimDevice copy, in MiB")
      ->check(CLI::Range(1, 4096));
  app.add_option("--cuda_copy_mib", cuda_copy_mib, "bytes per CUDA copy, in MiB")
      ->check(CLI::Range(1, 65536));
  const int exit_code = parse_command_line(app, argc, argv);
  options->sim_copy_bytes = static_cast<std::size_t>(sim_copy_mib) * kMiB;
  options->cuda_copy_bytes = static_cast<std::size_t>(cuda_copy_mib) * kMiB;
  return exit_code;
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
  const double modelled_bytes_per_s = options.device.sim_bandwidth_gbps * 1e9;
  SimDeviceOptions modelled;
  modelled.capacity_bytes = 2 * options.sim_copy_bytes + 64 * kMiB;
  modelled.bandwidth_bytes_per_s = modelled_bytes_per_s;
  SimDeviceOptions unmodelled = modelled;
  unmodelled.bandwidth_bytes_per_s = 0;

  if (DeviceFixture* fixture =
          owned.add(std::make_unique<SimDevice>(modelled), options.sim_copy_bytes)) {
    char bandwidth[32];
    std::snprintf(bandwidth, sizeof bandwidth, "%g", options.device.sim_bandwidth_gbps);
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
    return !options.device.cuda_required;
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
  if (const int exit_code = parse_options(argc, argv, &options); exit_code >= 0) return exit_code;

  BenchmarkState owned;
  if (options.device.run_sim) register_sim(options, owned);
  if (options.device.run_cuda && !register_cuda(options, owned)) {
    report_failure("--device asked for cuda, and no GPU is usable");
  }
  return run_and_report();
}
