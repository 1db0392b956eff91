// Several threads acquiring at once, each on its own compute stream, some
// tensors shared read-only and some owned, while another thread allocates
// "activations" from the same allocator and so spills chunks from under
// them. Every byte is checked. Meant to run under TSan and ASan too.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

struct SharedTensor {
  TensorId id;
  std::vector<std::uint8_t> bytes;  // never changes
};

// Each worker owns some tensors (it alone writes them) and reads the shared
// ones; the checks run as kernels on its stream, or from the host.
void run_worker(ChunkManager& chunks, Device& device, ClientId client, int worker,
                const std::vector<SharedTensor>& shared, int iterations, std::atomic<int>* errors,
                KernelQueue* kernels) {
  Stream stream;
  ASSERT_EQ(device.create_stream(&stream), Status::ok);
  std::mt19937_64 random(worker);
  struct Owned {
    TensorId id;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Owned> owned;
  for (int i = 0; i < 3; ++i) {
    const std::size_t bytes = 300 * KiB + 4 * KiB * i + worker;
    owned.push_back(
        {register_ok(chunks, client, bytes, "w" + std::to_string(worker) + "." + std::to_string(i)),
         random_bytes(bytes, 100 * worker + i)});
    write_on_device(chunks, owned.back().id, owned.back().bytes, stream);
  }
  for (int i = 0; i < iterations; ++i) {
    const bool host_wait = random() % 2 == 0;
    const WaitMode wait = host_wait ? WaitMode::host : WaitMode::stream;
    if (random() % 3 == 0) {
      const SharedTensor& tensor = shared[random() % shared.size()];
      void* ptr = nullptr;
      if (chunks.acquire(tensor.id, stream, &ptr, AccessMode::read, wait) != Status::ok) {
        ADD_FAILURE() << ChunkManager::last_error();
        errors->fetch_add(1);
        continue;
      }
      if (host_wait) {
        if (std::memcmp(ptr, tensor.bytes.data(), tensor.bytes.size()) != 0) {
          ADD_FAILURE() << "shared tensor read wrong bytes on the host";
          errors->fetch_add(1);
        }
      } else {
        kernels->check(stream, ptr, tensor.bytes, "shared");
      }
      chunks.release(tensor.id, stream);
    } else {
      Owned& tensor = owned[random() % owned.size()];
      void* ptr = nullptr;
      if (chunks.acquire(tensor.id, stream, &ptr, AccessMode::read_write, wait) != Status::ok) {
        ADD_FAILURE() << ChunkManager::last_error();
        errors->fetch_add(1);
        continue;
      }
      tensor.bytes = random_bytes(tensor.bytes.size(), random());
      if (host_wait) {
        std::memcpy(ptr, tensor.bytes.data(), tensor.bytes.size());
      } else {
        kernels->write(stream, ptr, tensor.bytes);
      }
      chunks.release(tensor.id, stream);
    }
    if (random() % 16 == 0) chunks.prefetch(shared[random() % shared.size()].id);
  }
  device.synchronize_stream(stream);
  for (Owned& tensor : owned) {
    if (read_on_host(chunks, tensor.id, tensor.bytes.size()) != tensor.bytes) {
      ADD_FAILURE() << "owned tensor ended with wrong bytes";
      errors->fetch_add(1);
    }
  }
  device.destroy_stream(stream);
}

// A thread allocating "activations" of 1-4 MiB from the rig's allocator
// until stopped, keeping a few live, so chunks spill from under the other
// threads. Out of memory is allowed (chunks in compute are not evictable);
// any other failure is a bug, counted in `errors`.
class ActivationThread {
 public:
  ActivationThread(ChunkRig& rig, std::uint64_t seed, std::atomic<int>& errors)
      : thread_([this, &rig, seed, &errors] { run(rig, seed, errors); }) {}
  ~ActivationThread() { stop(); }
  void stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run(ChunkRig& rig, std::uint64_t seed, std::atomic<int>& errors) {
    Stream stream;
    ASSERT_EQ(rig.device->create_stream(&stream), Status::ok);
    std::mt19937_64 random(seed);
    std::vector<void*> live;
    while (!done_.load()) {
      void* ptr = nullptr;
      const std::size_t bytes = (1 + random() % 4) * MiB;
      const Status status = rig.allocator->allocate(&ptr, bytes, stream);
      if (status == Status::ok) {
        std::memset(ptr, 0x77, bytes);
        live.push_back(ptr);
      } else if (status != Status::out_of_memory) {
        ADD_FAILURE() << to_string(status) << ": " << CachingAllocator::last_error();
        errors.fetch_add(1);
      }
      if (live.size() > 3 || (status != Status::ok && !live.empty())) {
        rig.allocator->deallocate(live.front());
        live.erase(live.begin());
      }
    }
    for (void* ptr : live) rig.allocator->deallocate(ptr);
    rig.device->synchronize_stream(stream);
    rig.device->destroy_stream(stream);
  }

  std::atomic<bool> done_{false};
  std::thread thread_;  // last: it starts once the members it uses exist
};

struct StressShape {
  int threads;
  int iterations;
  bool activations;  // a thread allocating from the allocator meanwhile
};

void run_stress(const StressShape& shape) {
  ChunkRigOptions options;
  // Room for every worker's chunk in compute plus a few to cycle through.
  options.allocator_budget = 32 * MiB;
  options.chunk_budget = static_cast<std::size_t>(shape.threads + 3) * options.chunk_size;
  options.copy_latency_ns = 5'000;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  KernelQueue kernels(*rig.device);
  const ClientId shared_client = chunks.add_client("shared");
  std::vector<SharedTensor> shared;
  for (int i = 0; i < 10; ++i) {
    const std::size_t bytes = 500 * KiB + 1000 * i;
    shared.push_back({register_ok(chunks, shared_client, bytes, "s" + std::to_string(i)),
                      random_bytes(bytes, 9000 + i)});
    write_on_device(chunks, shared.back().id, shared.back().bytes);
  }
  std::vector<ClientId> clients;
  for (int t = 0; t < shape.threads; ++t) clients.push_back(chunks.add_client("worker"));

  std::atomic<int> errors{0};
  std::optional<ActivationThread> activations;
  if (shape.activations) activations.emplace(rig, 77, errors);
  std::vector<std::thread> workers;
  for (int t = 0; t < shape.threads; ++t) {
    workers.emplace_back(run_worker, std::ref(chunks), std::ref(*rig.device), clients[t], t,
                         std::cref(shared), shape.iterations, &errors, &kernels);
  }
  for (std::thread& worker : workers) worker.join();
  if (activations) activations->stop();
  rig.device->synchronize();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(kernels.mismatches(), 0);
  for (const SharedTensor& tensor : shared) {
    EXPECT_EQ(read_on_host(chunks, tensor.id, tensor.bytes.size()), tensor.bytes);
  }
  EXPECT_GT(chunks.stats().evictions, 0);
  // Every client's tensors released: removal succeeds and frees everything.
  for (ClientId client : clients) EXPECT_EQ(chunks.remove_client(client), Status::ok);
  EXPECT_EQ(chunks.remove_client(shared_client), Status::ok);
  EXPECT_EQ(chunks.stats().chunk_bytes_device, 0);
  EXPECT_EQ(rig.allocator->stats().allocated_bytes.current, 0);
}

TEST(ChunkConcurrency, ConcurrentAcquiresFromSeveralThreads) {
  run_stress({.threads = 4, .iterations = 150, .activations = false});
}

TEST(ChunkConcurrency, StressWithAllocatorPressureFromAnotherThread) {
  run_stress({.threads = 4, .iterations = 300, .activations = true});
}

// The same step again and again, its accesses made in a fixed order by
// several threads taking turns, each on its own stream (its kernels still
// queued when the next thread acquires), while another thread allocates from
// the allocator; the thread of a step's last access ends the step. Under
// policy:planned the steps after the traced one follow the plan, and its
// prefetches start from inside acquires and releases on every thread.
TEST(ChunkConcurrency, RepeatedStepsTakenInTurnsFromSeveralThreads) {
  constexpr int kThreads = 3;
  constexpr int kTensorsPerThread = 2;
  constexpr int kAccessesPerStep = kThreads * kTensorsPerThread;
  constexpr int kSteps = 8;
  ChunkRigOptions options;
  options.allocator_budget = 32 * MiB;
  options.chunk_budget = 4 * options.chunk_size;  // six one-tensor chunks cycle through four
  options.copy_latency_ns = 5'000;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  KernelQueue kernels(*rig.device);
  const ClientId client = chunks.add_client("model");

  // The j-th access of a step is thread j % kThreads's tensor j / kThreads.
  auto tensor_of_access = [](int j) { return (j % kThreads) * kTensorsPerThread + j / kThreads; };
  struct Tensor {
    TensorId id;
    std::vector<std::uint8_t> bytes;  // what it holds; only its thread writes it
  };
  std::vector<Tensor> tensors(kAccessesPerStep);
  for (int i = 0; i < kAccessesPerStep; ++i) {
    const std::size_t bytes = 1536 * KiB + static_cast<std::size_t>(i);  // a chunk each
    tensors[i] = {register_ok(chunks, client, bytes, "t" + std::to_string(i)),
                  random_bytes(bytes, 500 + i)};
  }
  for (int j = 0; j < kAccessesPerStep; ++j) {  // step 1, in the steps' order
    const Tensor& tensor = tensors[tensor_of_access(j)];
    write_on_device(chunks, tensor.id, tensor.bytes);
  }
  chunks.end_step();

  std::mutex turn_mutex;
  std::condition_variable turn_changed;
  int turn = 0;  // accesses made so far, over all steps
  std::atomic<int> errors{0};
  auto worker = [&](int thread) {
    Stream stream;
    ASSERT_EQ(rig.device->create_stream(&stream), Status::ok);
    std::mt19937_64 random(thread);
    for (int step = 0; step < kSteps; ++step) {
      for (int j = thread; j < kAccessesPerStep; j += kThreads) {
        const int my_turn = step * kAccessesPerStep + j;
        std::unique_lock lock(turn_mutex);
        turn_changed.wait(lock, [&] { return turn == my_turn; });
        Tensor& tensor = tensors[tensor_of_access(j)];
        void* ptr = nullptr;
        if (chunks.acquire(tensor.id, stream, &ptr, AccessMode::read_write, WaitMode::stream) ==
            Status::ok) {
          kernels.check(stream, ptr, tensor.bytes, "t" + std::to_string(tensor_of_access(j)));
          tensor.bytes = random_bytes(tensor.bytes.size(), random());
          kernels.write(stream, ptr, tensor.bytes);
          if (chunks.release(tensor.id, stream) != Status::ok) errors.fetch_add(1);
        } else {
          ADD_FAILURE() << ChunkManager::last_error();
          errors.fetch_add(1);
        }
        if (j == kAccessesPerStep - 1) chunks.end_step();
        ++turn;
        turn_changed.notify_all();
      }
    }
    rig.device->synchronize_stream(stream);
    rig.device->destroy_stream(stream);
  };

  ActivationThread activations(rig, 91, errors);
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) workers.emplace_back(worker, t);
  for (std::thread& thread : workers) thread.join();
  activations.stop();
  rig.device->synchronize();

  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(kernels.mismatches(), 0) << ::testing::PrintToString(kernels.mismatch_names());
  for (const Tensor& tensor : tensors) {
    EXPECT_EQ(read_on_host(chunks, tensor.id, tensor.bytes.size()), tensor.bytes);
  }
  EXPECT_EQ(chunks.steps_ended(), static_cast<std::uint64_t>(kSteps + 1));
  if (chunks.policy_name() == "planned") {
    const PolicyState state = chunks.policy_state();
    EXPECT_GE(state.planned_steps, 1)
        << "phase " << state.phase << ", divergences " << state.divergences;
    EXPECT_GT(chunks.stats().prefetches, 0);
  }
}

}  // namespace
}  // namespace spillway::testing
