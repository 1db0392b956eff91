// bench_allocator: what a cached allocation costs, as metric lines.
//
//   metric alloc_free_pair_ns           one thread: allocate 4 KiB on the default
//                                       stream and free it, the block cached
//   metric alloc_free_pair_2threads_ns  the same pair on two threads at once
//                                       sharing one allocator: ns per pair per thread
//
// Plus, in the table only: pairs on a fragmented pool (many cached blocks of
// mixed sizes), and a burst of 64 allocations freed together.
//
//   bench_allocator [--benchmark_* flags]
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"
#include "bench/common/metric_reporter.h"

namespace spillway::bench {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Setup {
  SimDevice device{[] {
    SimDeviceOptions options;
    options.capacity_bytes = std::size_t{4} << 30;
    return options;
  }()};
  CachingAllocator allocator{device, CachingAllocatorOptions{std::size_t{2} << 30, 64 * kMiB}};
};

// One allocator for the whole program, shared by the threads of a benchmark.
CachingAllocator& shared_allocator() {
  static Setup* setup = new Setup;  // never destroyed: threads may outlive main's statics
  return setup->allocator;
}

double elapsed_ns(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

void BM_AllocFreePair(benchmark::State& state) {
  CachingAllocator& allocator = shared_allocator();
  void* warm = nullptr;  // the slab exists before timing starts
  if (allocator.allocate(&warm, 4 * kKiB, {}) != Status::ok) {
    state.SkipWithError(CachingAllocator::last_error().c_str());
    return;
  }
  allocator.deallocate(warm);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    void* ptr = nullptr;
    allocator.allocate(&ptr, 4 * kKiB, {});
    benchmark::DoNotOptimize(ptr);
    allocator.deallocate(ptr);
  }
  const double ns_per_pair = elapsed_ns(start) / static_cast<double>(state.iterations());
  const char* name = state.threads() == 1 ? "alloc_free_pair_ns" : "alloc_free_pair_2threads_ns";
  state.counters[metric_counter(name, "ns")] =
      benchmark::Counter(ns_per_pair, benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_AllocFreePair)->Threads(1)->UseRealTime();
BENCHMARK(BM_AllocFreePair)->Threads(2)->UseRealTime();

// Pairs of mixed sizes while ~1000 blocks of mixed sizes are cached or live:
// best fit in a populated tree, splits and merges with real neighbours.
void BM_AllocFreeFragmented(benchmark::State& state) {
  SimDevice device;
  CachingAllocator allocator(device, CachingAllocatorOptions{std::size_t{2} << 30, 64 * kMiB});
  std::mt19937_64 rng(3);
  std::vector<void*> live;
  for (int i = 0; i < 2000; ++i) {
    void* ptr = nullptr;
    allocator.allocate(&ptr, 512 + rng() % (256 * kKiB), {});
    live.push_back(ptr);
  }
  for (std::size_t i = 0; i < live.size(); i += 2) allocator.deallocate(live[i]);
  std::vector<std::size_t> sizes(1024);
  for (std::size_t& size : sizes) size = 512 + rng() % (256 * kKiB);
  std::size_t next = 0;
  for (auto _ : state) {
    void* ptr = nullptr;
    allocator.allocate(&ptr, sizes[next++ & 1023], {});
    benchmark::DoNotOptimize(ptr);
    allocator.deallocate(ptr);
  }
  for (std::size_t i = 1; i < live.size(); i += 2) allocator.deallocate(live[i]);
}
BENCHMARK(BM_AllocFreeFragmented);

// 64 allocations of 4-64 KiB, then 64 frees: per pair.
void BM_AllocBurstThenFree(benchmark::State& state) {
  CachingAllocator& allocator = shared_allocator();
  void* ptrs[64];
  for (auto _ : state) {
    for (int i = 0; i < 64; ++i) allocator.allocate(&ptrs[i], (4 + i % 16 * 4) * kKiB, {});
    for (int i = 63; i >= 0; --i) allocator.deallocate(ptrs[i]);
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_AllocBurstThenFree);

}  // namespace
}  // namespace spillway::bench

int main(int argc, char** argv) {
  spillway::bench::initialize(&argc, argv);
  return spillway::bench::run_and_report();
}
