// Several threads acquiring at once, each on its own compute stream, some
// tensors shared read-only and some owned, while another thread allocates
// "activations" from the same allocator and so spills chunks from under
// them. Every byte is checked. Meant to run under TSan and ASan too.
#include <gtest/gtest.h>

#include <atomic>
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
  std::atomic<bool> done{false};
  std::thread activations;
  std::atomic<int> activation_count{0};
  if (shape.activations) {
    activations = std::thread([&] {
      Stream stream;
      ASSERT_EQ(rig.device->create_stream(&stream), Status::ok);
      std::mt19937_64 random(77);
      std::vector<void*> live;
      while (!done.load()) {
        void* ptr = nullptr;
        const std::size_t bytes = (1 + random() % 4) * MiB;
        // Out of memory is allowed here: the workers' chunks in compute are
        // not evictable. Anything else is a bug.
        const Status status = rig.allocator->allocate(&ptr, bytes, stream);
        if (status == Status::ok) {
          std::memset(ptr, 0x77, bytes);
          live.push_back(ptr);
          activation_count.fetch_add(1);
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
    });
  }
  std::vector<std::thread> workers;
  for (int t = 0; t < shape.threads; ++t) {
    workers.emplace_back(run_worker, std::ref(chunks), std::ref(*rig.device), clients[t], t,
                         std::cref(shared), shape.iterations, &errors, &kernels);
  }
  for (std::thread& worker : workers) worker.join();
  done.store(true);
  if (activations.joinable()) activations.join();
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

}  // namespace
}  // namespace spillway::testing
