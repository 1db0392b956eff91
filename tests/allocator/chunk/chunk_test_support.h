// Helpers for the chunk manager tests: a SimDevice + CachingAllocator +
// ChunkManager bundle, tensors of random bytes with the test's own copy of
// what they should hold, and "kernels": host functions queued on a compute
// stream that write or check a tensor's device bytes, so that a missing
// stream wait shows up as wrong bytes.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/chunk/chunk_manager.h"
#include "allocator/device/sim_device.h"
#include "allocator/policy/lru_policy.h"
#include "allocator/policy/planned_policy.h"

namespace spillway::testing {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

struct ChunkRigOptions {
  std::size_t chunk_size = 2 * MiB;
  std::size_t allocator_budget = 256 * MiB;
  std::size_t chunk_budget = std::numeric_limits<std::size_t>::max();
  std::size_t host_budget = std::numeric_limits<std::size_t>::max();
  bool strict_residency = false;
  // Modelled copies: slow enough that a reader who does not wait sees old
  // bytes (Note [Reading before the event] in sim_device.cc).
  double bandwidth_bytes_per_s = 8e9;
  std::uint64_t copy_latency_ns = 20'000;
  std::size_t sim_capacity = 1024 * MiB;
  // Where the allocator's and the chunk manager's events go; none when null.
  TraceSink* trace = nullptr;
  // The eviction policy; when empty, the one SPILLWAY_TEST_POLICY names
  // (policy_under_test()).
  std::function<std::unique_ptr<EvictionPolicy>()> make_policy;
  // CachingAllocatorOptions::expandable_segments: chunk slabs are mapped
  // pages that go back after their fence (Note [Fenced slabs]).
  bool expandable_segments = false;
  // ChunkManagerOptions::planned_prefetch.
  bool planned_prefetch = true;
  // ChunkManagerOptions::copy_bytes_per_s is bandwidth_bytes_per_s: planned
  // prefetches are timed (Note [Prefetch timed by op durations]).
  bool timed_prefetch = false;
};

// The policy every suite runs under, as RMM runs one suite over every memory
// resource: SPILLWAY_TEST_POLICY=lru (or unset) or planned (one warmup step).
// ctest runs the chunk suites once per policy (tests/allocator/chunk/CMakeLists.txt).
inline std::unique_ptr<EvictionPolicy> policy_under_test() {
  const char* name = std::getenv("SPILLWAY_TEST_POLICY");
  const std::string policy = name == nullptr ? "lru" : name;
  if (policy == "lru") return std::make_unique<LruPolicy>();
  if (policy == "planned") return std::make_unique<PlannedPolicy>(1);
  ADD_FAILURE() << "SPILLWAY_TEST_POLICY=" << policy << ": expected lru or planned";
  return std::make_unique<LruPolicy>();
}

// Device, allocator and chunk manager, built in that order, destroyed in reverse.
struct ChunkRig {
  explicit ChunkRig(ChunkRigOptions options = {}) : options(options) {
    SimDeviceOptions sim;
    sim.capacity_bytes = options.sim_capacity;
    sim.bandwidth_bytes_per_s = options.bandwidth_bytes_per_s;
    sim.copy_latency_ns = options.copy_latency_ns;
    device = std::make_unique<SimDevice>(sim);
    CachingAllocatorOptions allocator_options;
    allocator_options.budget_bytes = options.allocator_budget;
    allocator_options.large_slab_bytes = options.chunk_size;
    allocator_options.expandable_segments = options.expandable_segments;
    allocator = std::make_unique<CachingAllocator>(*device, allocator_options, options.trace);
    ChunkManagerOptions manager_options;
    manager_options.chunk_size = options.chunk_size;
    manager_options.device_budget_bytes = options.chunk_budget;
    manager_options.host_budget_bytes = options.host_budget;
    manager_options.strict_residency = options.strict_residency;
    manager_options.planned_prefetch = options.planned_prefetch;
    if (options.timed_prefetch) manager_options.copy_bytes_per_s = options.bandwidth_bytes_per_s;
    chunks = std::make_unique<ChunkManager>(
        *device, *allocator, manager_options,
        options.make_policy ? options.make_policy() : policy_under_test(), options.trace);
  }
  ~ChunkRig() {
    chunks.reset();
    allocator.reset();
    device.reset();
  }

  ChunkRigOptions options;
  std::unique_ptr<SimDevice> device;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<ChunkManager> chunks;
};

inline TensorId register_ok(ChunkManager& chunks, ClientId client, std::size_t bytes,
                            std::string name, TensorKind kind = TensorKind::param,
                            std::uint32_t slot = 0) {
  TensorId id{};
  TensorSpec spec;
  spec.kind = kind;
  spec.slot = slot;
  spec.dtype_bytes = 1;
  spec.element_count = bytes;
  spec.name = std::move(name);
  EXPECT_EQ(chunks.register_tensor(client, spec, &id), Status::ok) << ChunkManager::last_error();
  return id;
}

inline std::vector<std::uint8_t> random_bytes(std::size_t bytes, std::uint64_t seed) {
  std::vector<std::uint8_t> data(bytes);
  std::mt19937_64 random(seed);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t word = random();
    std::memcpy(data.data() + i, &word, 8);
  }
  for (; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(random());
  return data;
}

// A kernel on a stream: copies `bytes` from `source` to `target` when the
// stream reaches it, or compares them and counts a mismatch. Owned by the
// KernelQueue until the stream has run it.
class KernelQueue {
 public:
  explicit KernelQueue(Device& device) : device_(device) {}
  ~KernelQueue() {
    EXPECT_EQ(pending_.load(), 0) << "synchronize the streams before the queue goes";
  }

  // Queues "write `data` to device memory at `target`".
  void write(Stream stream, void* target, std::vector<std::uint8_t> data) {
    launch(stream, new Kernel{this, Kernel::Kind::write, target, std::move(data), {}});
  }
  // Queues "check that device memory at `source` equals `expected`".
  void check(Stream stream, const void* source, std::vector<std::uint8_t> expected,
             std::string what) {
    launch(stream, new Kernel{this, Kernel::Kind::check, const_cast<void*>(source),
                              std::move(expected), std::move(what)});
  }

  int mismatches() const { return mismatches_.load(); }
  std::vector<std::string> mismatch_names() const {
    std::lock_guard lock(mutex_);
    return mismatch_names_;
  }

 private:
  struct Kernel {
    enum class Kind { write, check };
    KernelQueue* queue;
    Kind kind;
    void* memory;
    std::vector<std::uint8_t> data;
    std::string what;
  };

  void launch(Stream stream, Kernel* kernel) {
    pending_.fetch_add(1);
    ASSERT_EQ(device_.launch_host_function(stream, &KernelQueue::run, kernel), Status::ok);
  }

  static void run(void* raw) {
    std::unique_ptr<Kernel> kernel(static_cast<Kernel*>(raw));
    KernelQueue& queue = *kernel->queue;
    if (kernel->kind == Kernel::Kind::write) {
      std::memcpy(kernel->memory, kernel->data.data(), kernel->data.size());
    } else if (std::memcmp(kernel->memory, kernel->data.data(), kernel->data.size()) != 0) {
      queue.mismatches_.fetch_add(1);
      std::lock_guard lock(queue.mutex_);
      queue.mismatch_names_.push_back(kernel->what);
    }
    queue.pending_.fetch_sub(1);
  }

  Device& device_;
  std::atomic<int> pending_{0};
  std::atomic<int> mismatches_{0};
  mutable std::mutex mutex_;
  std::vector<std::string> mismatch_names_;
};

// Reads a tensor's bytes through acquire_host (the test's independent path).
inline std::vector<std::uint8_t> read_on_host(ChunkManager& chunks, TensorId id,
                                              std::size_t bytes) {
  void* data = nullptr;
  EXPECT_EQ(chunks.acquire_host(id, &data, AccessMode::read), Status::ok)
      << ChunkManager::last_error();
  std::vector<std::uint8_t> copy(bytes);
  if (data != nullptr) std::memcpy(copy.data(), data, bytes);
  EXPECT_EQ(chunks.release_host(id), Status::ok) << ChunkManager::last_error();
  return copy;
}

// Writes a tensor's bytes on the device from the host (WaitMode::host: the
// simulated device's memory is host memory).
inline void write_on_device(ChunkManager& chunks, TensorId id,
                            const std::vector<std::uint8_t>& data, Stream stream = {}) {
  void* ptr = nullptr;
  ASSERT_EQ(chunks.acquire(id, stream, &ptr, AccessMode::read_write, WaitMode::host), Status::ok)
      << ChunkManager::last_error();
  std::memcpy(ptr, data.data(), data.size());
  ASSERT_EQ(chunks.release(id, stream), Status::ok) << ChunkManager::last_error();
}

inline bool equal_on_device(ChunkManager& chunks, TensorId id,
                            const std::vector<std::uint8_t>& expected, Stream stream = {}) {
  void* ptr = nullptr;
  EXPECT_EQ(chunks.acquire(id, stream, &ptr, AccessMode::read, WaitMode::host), Status::ok)
      << ChunkManager::last_error();
  const bool equal = ptr != nullptr && std::memcmp(ptr, expected.data(), expected.size()) == 0;
  EXPECT_EQ(chunks.release(id, stream), Status::ok) << ChunkManager::last_error();
  return equal;
}

}  // namespace spillway::testing
