// bench_chunk: what the chunk manager's moves and accesses cost, as metric
// lines, defined here (and in docs/chunk-manager.md).
//
//   chunk_move_vs_modelled_bw   chunk moves' throughput over the SimDevice's
//                               modelled copy bandwidth, for the slower of the
//                               two directions: fetches (a read-only sweep
//                               through a small budget: every fetch evicts a
//                               clean chunk) and write-backs (dirty chunks
//                               evicted in a row). 1 = the model's speed.
//   chunk_fetch_vs_modelled_bw, chunk_writeback_vs_modelled_bw
//                               the two directions on their own.
//   chunk_swap_vs_modelled_bw   a sweep where every fetch also evicts a dirty
//                               chunk: bytes moved both ways over the time,
//                               over one direction's bandwidth (up to 2 when
//                               write-backs overlap fetches on the two engines).
//   acquire_resident_ns         acquire + release of a chunk already on the
//                               device (stream wait, the hot path of op hooks).
//   chunk_fill_ratio_demo_gpt, chunk_fill_ratio_gpt2_small,
//   chunk_fill_ratio_gpt2_medium
//                               the chunk manager's chunk_fill_ratio (tensor
//                               bytes over chunk bytes) once the model's
//                               parameters and gradients are registered: the
//                               demo's GPT at its 2 MiB chunks, GPT-2 small and
//                               medium at the default chunk_size (layouts:
//                               tools/chunksize/model_tensors.h). Not a time:
//                               the layout's own figure.
//   chunk_device_fill_demo_gpt  the demo GPT's tensor bytes over the bytes
//                               the caching allocator holds for its chunks,
//                               all resident: every device copy is a whole
//                               slab (Note [A device copy is a whole slab]).
//
// On a usable GPU (CudaDevice::probe), also (for tools/gpu_check.sh):
//   chunk_h2d_vs_memcpy, chunk_d2h_vs_memcpy
//                               chunk fetches (write-backs) over plain pinned
//                               cudaMemcpyAsync of the same bytes, same run.
//
//   bench_chunk [--device=auto|sim|cuda] [--sim_bandwidth_gbps=X] [--chunk_mib=N]
//               [--cuda_chunk_mib=N] [--benchmark_* flags]
// --device=auto (default) runs sim, and cuda when a GPU is usable ("# cuda:
// skipped (<reason>)" otherwise); --device=cuda requires one.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/chunk/chunk_manager.h"
#include "allocator/device/sim_device.h"
#include "bench/common/device_options.h"
#include "bench/common/metric_reporter.h"
#if SPILLWAY_BENCH_CHUNK_FILL
#include "allocator/config/config.h"
#include "tools/chunksize/model_tensors.h"
#endif
#if SPILLWAY_HAVE_CUDA
#include "allocator/device/cuda_device.h"
#endif

namespace spillway::bench {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Options {
  DeviceOptions device;
  // The default chunk_size.
  std::size_t chunk_bytes = 64 * kMiB;
  // Long enough that a PCIe/C2C copy lasts milliseconds, past launch costs.
  std::size_t cuda_chunk_bytes = 64 * kMiB;
};

Options& options() {
  static Options value;
  return value;
}

std::unique_ptr<Device> make_sim_device(std::size_t capacity_bytes) {
  SimDeviceOptions sim;
  sim.capacity_bytes = capacity_bytes;
  sim.bandwidth_bytes_per_s = options().device.sim_bandwidth_gbps * 1e9;
  sim.poison_byte = -1;
  return std::make_unique<SimDevice>(sim);
}

// An allocator and a chunk manager on `device`, holding `chunk_count` chunks
// of one tensor each.
struct MoveRig {
  MoveRig(std::unique_ptr<Device> owned_device, std::size_t chunk_bytes, std::size_t chunk_count,
          std::size_t chunk_budget_count)
      : device(std::move(owned_device)) {
    CachingAllocatorOptions allocator_options;
    allocator_options.large_slab_bytes = chunk_bytes;
    allocator = std::make_unique<CachingAllocator>(*device, allocator_options);
    ChunkManagerOptions manager_options;
    manager_options.chunk_size = chunk_bytes;
    manager_options.device_budget_bytes = chunk_budget_count * chunk_bytes;
    chunks = std::make_unique<ChunkManager>(*device, *allocator, manager_options);
    const ClientId client = chunks->add_client("bench");
    for (std::size_t i = 0; i < chunk_count; ++i) {
      TensorId id{};
      TensorSpec spec{TensorKind::param, 0, 1, chunk_bytes, "t" + std::to_string(i)};
      chunks->register_tensor(client, spec, &id);
      tensors.push_back(id);
    }
  }
  ~MoveRig() {
    chunks.reset();
    allocator.reset();
    device.reset();
  }

  // Acquires every tensor in order, prefetching the next one first.
  bool sweep(AccessMode access) {
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (chunks->prefetch(tensors[(i + 1) % tensors.size()]) != Status::ok) return false;
      void* ptr = nullptr;
      if (chunks->acquire(tensors[i], {}, &ptr, access, WaitMode::host) != Status::ok) return false;
      chunks->release(tensors[i], {});
    }
    chunks->synchronize();
    return true;
  }

  // Dirties every chunk on the device, then times evicting them all.
  double timed_writeback_seconds() {
    for (TensorId id : tensors) {
      void* ptr = nullptr;
      chunks->acquire(id, {}, &ptr, AccessMode::read_write, WaitMode::host);
      chunks->release(id, {});
    }
    chunks->synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (TensorId id : tensors) chunks->evict(chunks->tensor_info(id)->chunk);
    chunks->synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::unique_ptr<Device> device;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<ChunkManager> chunks;
  std::vector<TensorId> tensors;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double modelled_bandwidth() { return options().device.sim_bandwidth_gbps * 1e9; }

// The fetch figure, for chunk_move_vs_modelled_bw (benchmarks run in order).
double g_fetch_ratio = 0;

// Fetches: a read-only sweep, so every eviction is a clean drop and the
// fetch stream is the only engine at work.
void BM_ChunkFetch(benchmark::State& state) {
  const std::size_t chunk = options().chunk_bytes;
  MoveRig rig(make_sim_device(12 * chunk), chunk, 8, 3);
  if (!rig.sweep(AccessMode::read_write) || !rig.sweep(AccessMode::read)) {
    state.SkipWithError(ChunkManager::last_error().c_str());
    return;
  }
  double ratio = 0;
  for (auto _ : state) {
    const std::int64_t before = rig.chunks->stats().bytes_moved_h2d;
    const auto start = std::chrono::steady_clock::now();
    if (!rig.sweep(AccessMode::read)) state.SkipWithError(ChunkManager::last_error().c_str());
    const double seconds = seconds_since(start);
    const auto bytes = static_cast<double>(rig.chunks->stats().bytes_moved_h2d - before);
    ratio = bytes / seconds / modelled_bandwidth();
    state.SetIterationTime(seconds);
  }
  state.counters[metric_counter("chunk_fetch_vs_modelled_bw", "ratio")] = ratio;
  g_fetch_ratio = ratio;
}

// Write-backs: every chunk resident and dirty, then all evicted in a row.
void BM_ChunkWriteback(benchmark::State& state) {
  constexpr std::size_t kChunks = 6;
  const std::size_t chunk = options().chunk_bytes;
  MoveRig rig(make_sim_device((kChunks + 4) * chunk), chunk, kChunks, kChunks);
  if (!rig.sweep(AccessMode::read_write)) {
    state.SkipWithError(ChunkManager::last_error().c_str());
    return;
  }
  double ratio = 0;
  for (auto _ : state) {
    const std::int64_t before = rig.chunks->stats().bytes_moved_d2h;
    const double seconds = rig.timed_writeback_seconds();
    const auto bytes = static_cast<double>(rig.chunks->stats().bytes_moved_d2h - before);
    ratio = bytes / seconds / modelled_bandwidth();
    state.SetIterationTime(seconds);
  }
  state.counters[metric_counter("chunk_writeback_vs_modelled_bw", "ratio")] = ratio;
  state.counters[metric_counter("chunk_move_vs_modelled_bw", "ratio")] =
      g_fetch_ratio > 0 ? std::min(g_fetch_ratio, ratio) : ratio;
}

// Swaps: a read-write sweep, so each fetch evicts a dirty chunk. One spare
// slab in the allocator lets a fetch land in a block that is not the one
// being written back (Note [Reuse fences] in chunk_manager.cc).
void BM_ChunkSwap(benchmark::State& state) {
  const std::size_t chunk = options().chunk_bytes;
  MoveRig rig(make_sim_device(12 * chunk), chunk, 8, 4);
  if (!rig.sweep(AccessMode::read_write)) {
    state.SkipWithError(ChunkManager::last_error().c_str());
    return;
  }
  rig.chunks->set_device_budget_bytes(3 * chunk);
  double ratio = 0;
  for (auto _ : state) {
    const ChunkStats before = rig.chunks->stats();
    const auto start = std::chrono::steady_clock::now();
    if (!rig.sweep(AccessMode::read_write)) state.SkipWithError(ChunkManager::last_error().c_str());
    const double seconds = seconds_since(start);
    const ChunkStats after = rig.chunks->stats();
    const auto bytes = static_cast<double>(after.bytes_moved_h2d - before.bytes_moved_h2d +
                                           after.bytes_moved_d2h - before.bytes_moved_d2h);
    ratio = bytes / seconds / modelled_bandwidth();
    state.SetIterationTime(seconds);
  }
  state.counters[metric_counter("chunk_swap_vs_modelled_bw", "ratio")] = ratio;
}

// The hot path: the chunk is resident, its fetch long done.
void BM_AcquireResident(benchmark::State& state) {
  SimDevice device;
  CachingAllocatorOptions allocator_options;
  allocator_options.large_slab_bytes = 4 * kMiB;
  CachingAllocator allocator(device, allocator_options);
  ChunkManagerOptions manager_options;
  manager_options.chunk_size = 4 * kMiB;
  ChunkManager chunks(device, allocator, manager_options);
  const ClientId client = chunks.add_client("bench");
  TensorId id{};
  chunks.register_tensor(client, {TensorKind::param, 0, 4, 1024, "w"}, &id);
  void* ptr = nullptr;
  chunks.acquire(id, {}, &ptr, AccessMode::read, WaitMode::host);
  chunks.release(id, {});
  std::size_t pairs = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    chunks.acquire(id, {}, &ptr, AccessMode::read, WaitMode::stream);
    chunks.release(id, {});
    benchmark::DoNotOptimize(ptr);
    ++pairs;
  }
  const double seconds = seconds_since(start);
  state.counters[metric_counter("acquire_resident_ns", "ns")] =
      pairs == 0 ? 0 : seconds * 1e9 / static_cast<double>(pairs);
  device.synchronize();
}

void register_sim() {
  benchmark::RegisterBenchmark("sim/chunk_fetch", BM_ChunkFetch)
      ->UseManualTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("sim/chunk_writeback", BM_ChunkWriteback)
      ->UseManualTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("sim/chunk_swap", BM_ChunkSwap)
      ->UseManualTime()
      ->Iterations(3)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("sim/acquire_resident", BM_AcquireResident);
}

#if SPILLWAY_HAVE_CUDA
// Plain pinned copies of `bytes`, `count` times back to back on one stream:
// the yardstick for chunk moves on the same GPU, in the same run.
double plain_copy_seconds(Device& device, std::size_t bytes, int count, bool to_device) {
  void* host = nullptr;
  void* on_device = nullptr;
  Stream stream;
  if (device.host_malloc(&host, bytes) != Status::ok ||
      device.malloc(&on_device, bytes) != Status::ok ||
      device.create_stream(&stream) != Status::ok) {
    return 0;
  }
  device.copy_async(to_device ? on_device : host, to_device ? host : on_device, bytes, stream);
  device.synchronize_stream(stream);  // warm
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    device.copy_async(to_device ? on_device : host, to_device ? host : on_device, bytes, stream);
  }
  device.synchronize_stream(stream);
  const double seconds = seconds_since(start);
  device.destroy_stream(stream);
  device.free(on_device);
  device.host_free(host);
  return seconds;
}

void BM_CudaChunkMoves(benchmark::State& state) {
  constexpr std::size_t kChunks = 12;
  const std::size_t chunk = options().cuda_chunk_bytes;
  std::unique_ptr<CudaDevice> cuda;
  if (CudaDevice::create(0, &cuda) != Status::ok) {
    state.SkipWithError(CudaDevice::thread_last_error().c_str());
    return;
  }
  MoveRig rig(std::move(cuda), chunk, kChunks, 3);
  if (!rig.sweep(AccessMode::read_write) || !rig.sweep(AccessMode::read)) {
    state.SkipWithError(ChunkManager::last_error().c_str());
    return;
  }
  double h2d_ratio = 0;
  double d2h_ratio = 0;
  for (auto _ : state) {
    // Fetches: a read-only sweep through three chunks' room.
    std::int64_t before = rig.chunks->stats().bytes_moved_h2d;
    auto start = std::chrono::steady_clock::now();
    rig.sweep(AccessMode::read);
    const double fetch_seconds = seconds_since(start);
    const auto fetched = static_cast<double>(rig.chunks->stats().bytes_moved_h2d - before);
    const double plain_h2d = plain_copy_seconds(*rig.device, chunk, kChunks, true);
    h2d_ratio = (fetched / fetch_seconds) / (static_cast<double>(kChunks * chunk) / plain_h2d);

    // Write-backs: the three resident chunks dirtied, then evicted in a row.
    before = rig.chunks->stats().bytes_moved_d2h;
    std::size_t evicted = 0;
    for (TensorId id : rig.tensors) {
      if (rig.chunks->tensor_info(id)->location != Location::device) continue;
      void* ptr = nullptr;
      rig.chunks->acquire(id, {}, &ptr, AccessMode::read_write, WaitMode::host);
      rig.chunks->release(id, {});
      ++evicted;
    }
    rig.chunks->synchronize();
    start = std::chrono::steady_clock::now();
    for (TensorId id : rig.tensors) rig.chunks->evict(rig.chunks->tensor_info(id)->chunk);
    rig.chunks->synchronize();
    const double writeback_seconds = seconds_since(start);
    const auto written = static_cast<double>(rig.chunks->stats().bytes_moved_d2h - before);
    const int copies = static_cast<int>(evicted);
    const double plain_d2h = plain_copy_seconds(*rig.device, chunk, copies, false);
    d2h_ratio = (written / writeback_seconds) / (static_cast<double>(evicted * chunk) / plain_d2h);
    state.SetIterationTime(fetch_seconds + writeback_seconds);
  }
  state.counters[metric_counter("chunk_h2d_vs_memcpy", "ratio")] = h2d_ratio;
  state.counters[metric_counter("chunk_d2h_vs_memcpy", "ratio")] = d2h_ratio;
}
#endif

// False when a GPU was required and none is usable.
bool register_cuda() {
#if SPILLWAY_HAVE_CUDA
  std::string reason;
  if (CudaDevice::probe(&reason)) {
    report_note("cuda: chunk moves of " + std::to_string(options().cuda_chunk_bytes / kMiB) +
                " MiB against plain pinned copies");
    benchmark::RegisterBenchmark("cuda/chunk_moves", BM_CudaChunkMoves)
        ->UseManualTime()
        ->Iterations(3)
        ->Unit(benchmark::kMillisecond);
    return true;
  }
#else
  const std::string reason = "spillway was built without the CUDA backend";
#endif
  report_note("cuda: skipped (" + reason + ")");
  return !options().device.cuda_required;
}

#if SPILLWAY_BENCH_CHUNK_FILL
struct Fill {
  double ratio = 0;         // chunk_fill_ratio
  double device_ratio = 0;  // tensor bytes over the allocator's model bytes, all resident
};

// Registers `shape`'s tensors with a chunk manager and reads its
// chunk_fill_ratio; with `make_resident`, also acquires every tensor once,
// so every chunk has its device copy, and divides the tensor bytes by what
// the allocator hands the chunks.
Fill fill_of(const chunksize::GptModuleShape& shape, std::size_t chunk_size, bool make_resident) {
  SimDeviceOptions sim;
  sim.poison_byte = -1;
  SimDevice device(sim);
  CachingAllocatorOptions allocator_options;
  allocator_options.large_slab_bytes = chunk_size;
  CachingAllocator allocator(device, allocator_options);
  ChunkManagerOptions manager_options;
  manager_options.chunk_size = chunk_size;
  ChunkManager chunks(device, allocator, manager_options);
  const ClientId client = chunks.add_client("model");
  std::vector<TensorId> ids;
  for (const chunksize::ModelTensor& tensor : chunksize::gpt_module_tensors(shape)) {
    const TensorKind kind =
        tensor.kind == chunksize::DataKind::grad ? TensorKind::grad : TensorKind::param;
    TensorId id{};
    if (chunks.register_tensor(client, {kind, 0, 1, tensor.bytes, tensor.name}, &id) !=
        Status::ok) {
      report_failure("registering " + tensor.name + ": " + ChunkManager::last_error());
      return {};
    }
    ids.push_back(id);
  }
  Fill fill;
  const ChunkStats stats = chunks.stats();
  fill.ratio = stats.fill_ratio();
  if (!make_resident) return fill;
  for (TensorId id : ids) {
    void* data = nullptr;
    if (chunks.acquire(id, {}, &data, AccessMode::read, WaitMode::host) != Status::ok ||
        chunks.release(id, {}) != Status::ok) {
      report_failure("making the chunks resident: " + ChunkManager::last_error());
      return fill;
    }
  }
  chunks.synchronize();
  fill.device_ratio = static_cast<double>(stats.tensor_bytes) /
                      static_cast<double>(allocator.stats().allocated_bytes_model.current);
  return fill;
}
#endif

void report_fill_ratios() {
#if SPILLWAY_BENCH_CHUNK_FILL
  const std::size_t default_chunk_size = Config{}.chunk_size;
  // spillway-train-demo's configuration has chunk_size:2MiB.
  const Fill demo = fill_of(chunksize::demo_gpt_shape(), 2 * kMiB, true);
  report_metric("chunk_fill_ratio_demo_gpt", demo.ratio, "ratio");
  report_metric("chunk_device_fill_demo_gpt", demo.device_ratio, "ratio");
  report_metric("chunk_fill_ratio_gpt2_small",
                fill_of(chunksize::gpt2_small_shape(), default_chunk_size, false).ratio, "ratio");
  report_metric("chunk_fill_ratio_gpt2_medium",
                fill_of(chunksize::gpt2_medium_shape(), default_chunk_size, false).ratio, "ratio");
#else
  report_note("chunk_fill_ratio_*: skipped (built without the tools' model layouts)");
#endif
}

// Returns -1 to run, else the exit code.
int parse_options(int argc, char** argv) {
  CLI::App app{"bench_chunk: what the chunk manager's moves and accesses cost, as metric lines"};
  add_device_options(app, &options().device);
  int chunk_mib = static_cast<int>(options().chunk_bytes / kMiB);
  int cuda_chunk_mib = static_cast<int>(options().cuda_chunk_bytes / kMiB);
  // At least 2 MiB, as chunk_size: a chunk is one whole large-pool slab.
  app.add_option("--chunk_mib", chunk_mib, "SimDevice chunk size in MiB")
      ->check(CLI::Range(2, 4096));
  app.add_option("--cuda_chunk_mib", cuda_chunk_mib, "CUDA chunk size in MiB")
      ->check(CLI::Range(2, 65536));
  const int exit_code = parse_command_line(app, argc, argv);
  options().chunk_bytes = static_cast<std::size_t>(chunk_mib) * kMiB;
  options().cuda_chunk_bytes = static_cast<std::size_t>(cuda_chunk_mib) * kMiB;
  return exit_code;
}

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  spillway::bench::initialize(&argc, argv);
  if (const int exit_code = spillway::bench::parse_options(argc, argv); exit_code >= 0) {
    return exit_code;
  }
  if (spillway::bench::options().device.run_sim) spillway::bench::register_sim();
  spillway::bench::report_fill_ratios();
  if (spillway::bench::options().device.run_cuda && !spillway::bench::register_cuda()) {
    spillway::bench::report_failure("--device=cuda asked for a GPU, and none is usable");
  }
  return spillway::bench::run_and_report();
}
