// Eviction: what may go (never a chunk in compute), what a write-back costs
// (dirty versus clean), the policy's order, the allocator's pressure, and the
// errors when nothing can go.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "allocator/policy/lru_policy.h"
#include "chunk_test_support.h"
#include "tests/allocator/device/stream_gate.h"

namespace spillway::testing {
namespace {

using ::testing::HasSubstr;

// One tensor filling most of each chunk, so tensor i is chunk i.
std::vector<TensorId> one_tensor_per_chunk(ChunkManager& chunks, ClientId client, int count,
                                           std::size_t bytes) {
  std::vector<TensorId> ids;
  for (int i = 0; i < count; ++i) {
    ids.push_back(register_ok(chunks, client, bytes, "w" + std::to_string(i)));
  }
  return ids;
}

TEST(ChunkEviction, AChunkInComputeIsNeverEvicted) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const std::size_t bytes = 1536 * KiB;
  const auto ids = one_tensor_per_chunk(chunks, client, 10, bytes);
  const auto pinned_bytes = random_bytes(bytes, 1);
  write_on_device(chunks, ids[0], pinned_bytes);

  void* pinned = nullptr;
  ASSERT_EQ(chunks.acquire(ids[0], {}, &pinned, AccessMode::read_write, WaitMode::host),
            Status::ok);
  const ChunkId pinned_chunk = chunks.tensor_info(ids[0])->chunk;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 1; i < ids.size(); ++i) {
      write_on_device(chunks, ids[i], random_bytes(bytes, 100 + i));
      ASSERT_EQ(chunks.chunk_info(pinned_chunk)->location, Location::device);
      ASSERT_EQ(chunks.tensor_info(ids[0])->address, pinned);
    }
  }
  // Neither pressure nor an explicit evict takes it.
  EXPECT_EQ(chunks.relieve_pressure(std::size_t{1} << 40, {}), options.chunk_size);
  EXPECT_EQ(chunks.chunk_info(pinned_chunk)->location, Location::device);
  EXPECT_EQ(chunks.evict(pinned_chunk), Status::invalid_argument);
  EXPECT_EQ(std::memcmp(pinned, pinned_bytes.data(), bytes), 0);
  EXPECT_EQ(chunks.chunk_info(pinned_chunk)->state, TensorState::compute);
  ASSERT_EQ(chunks.release(ids[0], {}), Status::ok);
  EXPECT_EQ(chunks.chunk_info(pinned_chunk)->state, TensorState::hold);
  EXPECT_EQ(chunks.evict(pinned_chunk), Status::ok);
  EXPECT_EQ(chunks.chunk_info(pinned_chunk)->location, Location::host);
  EXPECT_TRUE(equal_on_device(chunks, ids[0], pinned_bytes));
}

TEST(ChunkEviction, DirtyChunksAreWrittenBackAndCleanOnesJustDropped) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 1000 * KiB, "a");
  const TensorId b = register_ok(chunks, client, 200 * KiB, "b");
  const ChunkId chunk = chunks.tensor_info(a)->chunk;
  const std::size_t used = chunks.chunk_info(chunk)->used_bytes;
  ASSERT_EQ(chunks.tensor_info(b)->chunk, chunk);

  const auto a_bytes = random_bytes(1000 * KiB, 1);
  write_on_device(chunks, a, a_bytes);
  EXPECT_TRUE(chunks.chunk_info(chunk)->dirty);
  ASSERT_EQ(chunks.evict(chunk), Status::ok);
  EXPECT_EQ(chunks.stats().bytes_moved_d2h, static_cast<std::int64_t>(used));
  EXPECT_EQ(chunks.stats().writebacks, 1);

  // Read only: the host copy stays current, so eviction copies nothing.
  EXPECT_TRUE(equal_on_device(chunks, a, a_bytes));
  EXPECT_FALSE(chunks.chunk_info(chunk)->dirty);
  ASSERT_EQ(chunks.evict(chunk), Status::ok);
  EXPECT_EQ(chunks.stats().bytes_moved_d2h, static_cast<std::int64_t>(used));
  EXPECT_EQ(chunks.stats().evictions, 2);

  // Writing one tensor dirties the chunk: the next eviction writes it all back.
  const auto b_bytes = random_bytes(200 * KiB, 2);
  write_on_device(chunks, b, b_bytes);
  ASSERT_EQ(chunks.evict(chunk), Status::ok);
  EXPECT_EQ(chunks.stats().bytes_moved_d2h, static_cast<std::int64_t>(2 * used));
  // The first fetch zeroed the chunk on the device (Note [A chunk without
  // bytes is zeroed on the device]); the two after it copied.
  EXPECT_EQ(chunks.stats().bytes_moved_h2d, static_cast<std::int64_t>(2 * used));
  EXPECT_EQ(read_on_host(chunks, a, a_bytes.size()), a_bytes);
  EXPECT_EQ(read_on_host(chunks, b, b_bytes.size()), b_bytes);
}

TEST(ChunkEviction, LruEvictsTheLeastRecentlyAccessedChunk) {
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  options.make_policy = [] {
    return std::make_unique<LruPolicy>();
  };  // LRU's order, whatever the suite's
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const auto ids = one_tensor_per_chunk(chunks, client, 4, 1536 * KiB);
  for (int i = 0; i < 3; ++i) write_on_device(chunks, ids[i], random_bytes(1536 * KiB, i));
  // Touch 0 again: 1 is now the least recent.
  write_on_device(chunks, ids[0], random_bytes(1536 * KiB, 9));
  write_on_device(chunks, ids[3], random_bytes(1536 * KiB, 3));
  EXPECT_EQ(chunks.tensor_info(ids[1])->location, Location::host);
  EXPECT_EQ(chunks.tensor_info(ids[0])->location, Location::device);
  EXPECT_EQ(chunks.tensor_info(ids[2])->location, Location::device);
}

TEST(ChunkEviction, PrefetchStartsAFetchThatAcquireThenUses) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  rig.device->set_copy_delay_ns(2'000'000);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const auto ids = one_tensor_per_chunk(chunks, client, 3, 1536 * KiB);
  const auto bytes = random_bytes(1536 * KiB, 5);
  write_on_device(chunks, ids[0], bytes);
  ASSERT_EQ(chunks.evict(chunks.tensor_info(ids[0])->chunk), Status::ok);
  ASSERT_EQ(chunks.prefetch(ids[0]), Status::ok);
  EXPECT_EQ(chunks.tensor_info(ids[0])->location, Location::device);
  EXPECT_EQ(chunks.stats().prefetches, 1);
  EXPECT_TRUE(equal_on_device(chunks, ids[0], bytes));  // waits for the prefetch's event
  // With every chunk in compute, a prefetch does nothing and says so.
  void* p1 = nullptr;
  void* p2 = nullptr;
  ASSERT_EQ(chunks.acquire(ids[1], {}, &p1), Status::ok);
  ASSERT_EQ(chunks.acquire(ids[0], {}, &p2), Status::ok);
  EXPECT_EQ(chunks.prefetch(ids[2]), Status::out_of_memory);
  EXPECT_EQ(chunks.tensor_info(ids[2])->location, Location::none);
  chunks.release(ids[1], {});
  chunks.release(ids[0], {});
}

// "Activations" from the caching allocator push chunks out; the chunks come
// back bit-exact afterwards.
TEST(ChunkEviction, AllocatorPressureSpillsChunksAndTheyComeBackExact) {
  ChunkRigOptions options;
  options.allocator_budget = 16 * MiB;  // eight chunk slabs
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  CachingAllocator& allocator = *rig.allocator;
  Stream compute;
  ASSERT_EQ(rig.device->create_stream(&compute), Status::ok);
  const ClientId client = chunks.add_client("model");
  const auto ids = one_tensor_per_chunk(chunks, client, 7, 2 * MiB);
  std::vector<std::vector<std::uint8_t>> expected;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    expected.push_back(random_bytes(2 * MiB, i));
    write_on_device(chunks, ids[i], expected[i], compute);
  }
  EXPECT_EQ(chunks.stats().chunk_bytes_device, static_cast<std::int64_t>(14 * MiB));

  // 12 MiB of activations on the compute stream: at least five chunks must go.
  std::vector<void*> activations;
  for (std::size_t bytes : {4 * MiB, 3 * MiB, 2 * MiB, 512 * KiB, 2 * MiB + 512 * KiB}) {
    void* ptr = nullptr;
    ASSERT_EQ(allocator.allocate(&ptr, bytes, compute), Status::ok)
        << CachingAllocator::last_error();
    std::memset(ptr, 0x5A, bytes);  // a kernel writing its output
    activations.push_back(ptr);
  }
  EXPECT_GE(chunks.stats().evictions, 5);
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  EXPECT_LE(allocator.stats().reserved_bytes.current, static_cast<std::int64_t>(16 * MiB));
  for (void* ptr : activations) ASSERT_EQ(allocator.deallocate(ptr), Status::ok);

  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(equal_on_device(chunks, ids[i], expected[i], compute)) << i;
  }
  EXPECT_EQ(allocator.stats().num_ooms, 0);
  rig.device->synchronize();
  rig.device->destroy_stream(compute);
}

// Chunks of a tight chunk budget fetched while activations hold most of the
// allocator's budget: the fetch finds room by evicting, without an
// out-of-memory in the allocator's counters.
TEST(ChunkEviction, FetchesMakeRoomInTheAllocatorByEvicting) {
  ChunkRigOptions options;
  options.allocator_budget = 12 * MiB;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  void* activation = nullptr;
  ASSERT_EQ(rig.allocator->allocate(&activation, 6 * MiB, {}), Status::ok);
  const auto ids = one_tensor_per_chunk(chunks, client, 6, 2 * MiB);
  std::vector<std::vector<std::uint8_t>> expected;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    expected.push_back(random_bytes(2 * MiB, 50 + i));
    write_on_device(chunks, ids[i], expected[i]);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(equal_on_device(chunks, ids[i], expected[i]));
  }
  EXPECT_LE(chunks.stats().chunk_bytes_device, static_cast<std::int64_t>(6 * MiB));
  EXPECT_EQ(rig.allocator->stats().num_ooms, 0);
  rig.allocator->deallocate(activation);
}

TEST(ChunkEviction, AChunkLargerThanTheBudgetFailsWithTheFigures) {
  ChunkRigOptions options;
  options.chunk_budget = 4 * MiB;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("actor");
  const TensorId huge = register_ok(chunks, client, 6 * MiB, "embedding.weight");
  void* ptr = nullptr;
  EXPECT_EQ(chunks.acquire(huge, {}, &ptr), Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  const std::string message = ChunkManager::last_error();
  EXPECT_THAT(message, HasSubstr("'embedding.weight'"));
  EXPECT_THAT(message, HasSubstr("6.00 MiB"));
  EXPECT_THAT(message, HasSubstr("whole chunk budget of 4.00 MiB"));
}

TEST(ChunkEviction, NothingEvictableSaysWhoHoldsWhat) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId actor = chunks.add_client("actor");
  const ClientId critic = chunks.add_client("critic");
  const TensorId a = register_ok(chunks, actor, 1536 * KiB, "actor.fc1.weight");
  const TensorId c = register_ok(chunks, critic, 1536 * KiB, "critic.head.bias");
  const TensorId third = register_ok(chunks, actor, 1536 * KiB, "actor.fc2.weight");
  void* ptr = nullptr;
  ASSERT_EQ(chunks.acquire(a, {}, &ptr), Status::ok);
  ASSERT_EQ(chunks.acquire(c, {}, &ptr), Status::ok);
  ASSERT_EQ(chunks.acquire(c, {}, &ptr), Status::ok);
  EXPECT_EQ(chunks.acquire(third, {}, &ptr), Status::out_of_memory);
  const std::string message = ChunkManager::last_error();
  EXPECT_THAT(message, HasSubstr("'actor.fc2.weight'"));
  EXPECT_THAT(message, HasSubstr("none can be evicted"));
  EXPECT_THAT(message, HasSubstr("'actor.fc1.weight' x1"));
  EXPECT_THAT(message, HasSubstr("'critic.head.bias' x2"));
  EXPECT_THAT(message, HasSubstr("client 'critic'"));
  EXPECT_THAT(chunks.describe_holdings(), HasSubstr("(2 in compute)"));
  chunks.release(a, {});
  EXPECT_EQ(chunks.acquire(third, {}, &ptr), Status::ok) << ChunkManager::last_error();
  chunks.release(third, {});
  chunks.release(c, {});
  chunks.release(c, {});
}

TEST(ChunkEviction, MisuseIsAnErrorNotACrash) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 1000, "a");
  void* ptr = nullptr;
  EXPECT_EQ(chunks.release(a, {}), Status::invalid_argument);
  EXPECT_THAT(ChunkManager::last_error(), HasSubstr("not acquired"));
  EXPECT_EQ(chunks.acquire(TensorId{999}, {}, &ptr), Status::invalid_argument);
  EXPECT_THAT(ChunkManager::last_error(), HasSubstr("not registered"));
  ASSERT_EQ(chunks.acquire_host(a, &ptr), Status::ok);
  EXPECT_EQ(chunks.acquire(a, {}, &ptr), Status::invalid_argument);
  EXPECT_THAT(ChunkManager::last_error(), HasSubstr("one side at a time"));
  EXPECT_EQ(chunks.discard(a), Status::invalid_argument);
  ASSERT_EQ(chunks.release_host(a), Status::ok);
  TensorId id{};
  EXPECT_EQ(chunks.register_tensor(ClientId{77}, {}, &id), Status::invalid_argument);
}

TEST(ChunkEviction, DiscardingEveryTensorReleasesTheChunk) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 1000, "a", TensorKind::grad);
  const TensorId b = register_ok(chunks, client, 1000, "b", TensorKind::grad);
  write_on_device(chunks, a, random_bytes(1000, 1));
  write_on_device(chunks, b, random_bytes(1000, 2));
  ASSERT_EQ(chunks.discard(a), Status::ok);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::device);  // b still matters
  ASSERT_EQ(chunks.discard(b), Status::ok);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::none);
  EXPECT_EQ(chunks.stats().chunk_bytes_device, 0);
  EXPECT_EQ(chunks.stats().chunk_bytes_host, 0);
  EXPECT_TRUE(equal_on_device(chunks, b, std::vector<std::uint8_t>(1000, 0)));
}

// Runs `work` on a thread of its own, joined when this goes.
class InBackground {
 public:
  explicit InBackground(std::function<void()> work)
      : thread_([this, work = std::move(work)] {
          work();
          done_.store(true);
        }) {}
  ~InBackground() { thread_.join(); }
  bool finishes_within(std::chrono::milliseconds patience) const {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!done_.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done_.load();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;  // after done_, which it sets
};

// Note [Fenced slabs] (caching_allocator.cc) and Note [Reuse fences]
// (chunk_mover.cc): the slab of an evicted clean chunk goes back to the
// device after the kernels still reading it, and not after the write-backs
// queued on the link, which are other chunks'.
TEST(ChunkEviction, AnEvictedSlabGoesBackAfterItsKernelsAndNotAfterTheLink) {
  ChunkRigOptions options;
  options.expandable_segments = true;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  SimDevice& device = *rig.device;
  const ClientId client = chunks.add_client("model");
  const std::size_t bytes = 1536 * KiB;
  const TensorId id = one_tensor_per_chunk(chunks, client, 1, bytes)[0];
  const auto expected = random_bytes(bytes, 9);
  write_on_device(chunks, id, expected);
  const ChunkId chunk = chunks.tensor_info(id)->chunk;
  ASSERT_EQ(chunks.evict(chunk), Status::ok);  // written back: clean from here on
  rig.allocator->empty_cache();
  Stream compute{};
  ASSERT_EQ(device.create_stream(&compute), Status::ok);
  KernelQueue kernels(device);
  void* slab = nullptr;
  {
    StreamGate link(device, chunks.writeback_stream());  // write-backs queued ahead
    StreamGate kernel(device, compute);
    ASSERT_EQ(chunks.acquire(id, compute, &slab, AccessMode::read, WaitMode::host), Status::ok)
        << ChunkManager::last_error();
    kernels.check(compute, slab, expected, "the kernel queued before the eviction");
    ASSERT_EQ(chunks.release(id, compute), Status::ok);
    ASSERT_EQ(chunks.evict(chunk), Status::ok);
    {
      InBackground give_back([&] { rig.allocator->empty_cache(); });
      EXPECT_FALSE(give_back.finishes_within(std::chrono::milliseconds(300)))
          << "the slab went back while a kernel could still read it";
      kernel.open();
      EXPECT_TRUE(give_back.finishes_within(std::chrono::seconds(5)))
          << "the slab of a clean chunk waited for the write-backs on the link";
      link.open();
    }
  }
  ASSERT_EQ(device.synchronize_stream(compute), Status::ok);
  EXPECT_EQ(kernels.mismatches(), 0);
  EXPECT_FALSE(device.is_mapped(slab, options.chunk_size));
  EXPECT_EQ(rig.allocator->stats().reserved_bytes.current, 0);
  EXPECT_TRUE(equal_on_device(chunks, id, expected));
  device.destroy_stream(compute);
}

TEST(ChunkLruPolicy, ChoosesTheOldestAcceptableChunk) {
  struct AllBut final : EvictionCandidates {
    ChunkId excluded;
    bool evictable(ChunkId chunk) const override { return chunk != excluded; }
  };
  LruPolicy lru;
  for (std::uint32_t i = 0; i < 4; ++i) lru.on_resident(ChunkId{i});
  lru.on_access(ChunkId{0});
  AllBut candidates;
  candidates.excluded = ChunkId{1};
  EXPECT_EQ(lru.choose_victim(candidates), ChunkId{2});
  lru.on_evicted(ChunkId{2});
  EXPECT_EQ(lru.choose_victim(candidates), ChunkId{3});
  lru.on_access(ChunkId{3});
  EXPECT_EQ(lru.choose_victim(candidates), ChunkId{0});
  NoEvictionPolicy never;
  EXPECT_EQ(never.choose_victim(candidates), std::nullopt);
}

}  // namespace
}  // namespace spillway::testing
