// Clients share one budget and keep their own figures; removing one frees
// its memory on both sides. Observers follow every move; relayout re-packs.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include <map>
#include <random>

#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

// Keeps the latest address and location it was told for every tensor.
class AddressBook final : public ChunkObserver {
 public:
  void on_tensors_moved(std::span<const TensorAddress> tensors) override {
    for (const TensorAddress& moved : tensors) latest_[moved.tensor] = moved;
    ++calls_;
  }
  const TensorAddress* find(TensorId id) const {
    auto found = latest_.find(id);
    return found == latest_.end() ? nullptr : &found->second;
  }
  int calls() const { return calls_; }

 private:
  std::map<TensorId, TensorAddress> latest_;  // only touched under the manager's lock
  int calls_ = 0;
};

TEST(ChunkClients, TwoClientsInterleavedInOneBudgetKeepExactData) {
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  Stream compute;
  ASSERT_EQ(rig.device->create_stream(&compute), Status::ok);
  KernelQueue kernels(*rig.device);
  const ClientId actor = chunks.add_client("actor");
  const ClientId critic = chunks.add_client("critic");

  struct Case {
    ClientId client;
    TensorId id;
    std::vector<std::uint8_t> bytes;
  };
  std::vector<Case> cases;
  std::mt19937_64 random(3);
  for (int i = 0; i < 24; ++i) {
    const ClientId client = i % 2 == 0 ? actor : critic;
    const std::size_t bytes =
        std::uniform_int_distribution<std::size_t>(4 * KiB, 700 * KiB)(random);
    const TensorKind kind = i % 3 == 0 ? TensorKind::optimizer_state : TensorKind::param;
    cases.push_back({client,
                     register_ok(chunks, client, bytes, "t" + std::to_string(i), kind, i % 2),
                     random_bytes(bytes, 1000 + i)});
  }
  // Each client's chunks hold only its own tensors.
  for (const Case& c : cases) {
    EXPECT_EQ(chunks.chunk_info(chunks.tensor_info(c.id)->chunk)->client, c.client);
  }
  for (Case& c : cases) write_on_device(chunks, c.id, c.bytes, compute);
  for (int step = 0; step < 5; ++step) {
    for (Case& c : cases) {  // interleaved: actor, critic, actor, ...
      void* ptr = nullptr;
      ASSERT_EQ(chunks.acquire(c.id, compute, &ptr), Status::ok) << ChunkManager::last_error();
      kernels.check(compute, ptr, c.bytes, "step " + std::to_string(step));
      c.bytes = random_bytes(c.bytes.size(), random());
      kernels.write(compute, ptr, c.bytes);
      ASSERT_EQ(chunks.release(c.id, compute), Status::ok);
    }
  }
  rig.device->synchronize_stream(compute);
  EXPECT_EQ(kernels.mismatches(), 0);
  for (const Case& c : cases) EXPECT_EQ(read_on_host(chunks, c.id, c.bytes.size()), c.bytes);

  const ChunkStats total = chunks.stats();
  const ChunkStats a = chunks.client_stats(actor);
  const ChunkStats b = chunks.client_stats(critic);
  EXPECT_GT(a.evictions, 0);
  EXPECT_GT(b.evictions, 0);
  EXPECT_EQ(a.evictions + b.evictions, total.evictions);
  EXPECT_EQ(a.bytes_moved_h2d + b.bytes_moved_h2d, total.bytes_moved_h2d);
  EXPECT_EQ(a.bytes_moved_d2h + b.bytes_moved_d2h, total.bytes_moved_d2h);
  EXPECT_EQ(a.chunk_bytes_device + b.chunk_bytes_device, total.chunk_bytes_device);
  EXPECT_EQ(a.chunk_bytes_host + b.chunk_bytes_host, total.chunk_bytes_host);
  Stats stats;
  total.add_to(&stats);
  EXPECT_EQ(stats.evictions, total.evictions);
  EXPECT_EQ(stats.bytes_moved_d2h, total.bytes_moved_d2h);
  rig.device->destroy_stream(compute);
}

TEST(ChunkClients, RemovingAClientFreesItsMemoryOnBothSides) {
  ChunkRigOptions options;
  options.chunk_budget = 4 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId keep = chunks.add_client("keep");
  const ClientId gone = chunks.add_client("gone");
  const TensorId kept = register_ok(chunks, keep, 1536 * KiB, "kept");
  const auto kept_bytes = random_bytes(1536 * KiB, 1);
  write_on_device(chunks, kept, kept_bytes);
  // Its write-back makes its host copy (a first fetch zeroes on the device).
  ASSERT_EQ(chunks.evict(chunks.tensor_info(kept)->chunk), Status::ok);
  const HostPoolStats host_before = chunks.host_pool_stats();

  std::vector<TensorId> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(register_ok(chunks, gone, 1536 * KiB, "g" + std::to_string(i)));
    write_on_device(chunks, ids.back(), random_bytes(1536 * KiB, 10 + i));
  }
  EXPECT_GT(chunks.client_stats(gone).chunk_bytes_device, 0);
  EXPECT_GT(chunks.client_stats(gone).chunk_bytes_host, 0);
  void* ptr = nullptr;
  ASSERT_EQ(chunks.acquire(ids[7], {}, &ptr), Status::ok);
  EXPECT_EQ(chunks.remove_client(gone), Status::invalid_argument);  // still acquired
  EXPECT_THAT(ChunkManager::last_error(), ::testing::HasSubstr("'g7' x1"));
  ASSERT_EQ(chunks.release(ids[7], {}), Status::ok);

  const std::int64_t gone_device = chunks.client_stats(gone).chunk_bytes_device;
  const std::int64_t gone_host = chunks.client_stats(gone).chunk_bytes_host;
  const std::int64_t allocated_before = rig.allocator->stats().allocated_bytes.current;
  const std::size_t host_in_use_before = chunks.host_pool_stats().in_use_bytes;
  AddressBook book;
  chunks.add_observer(&book);
  ASSERT_EQ(chunks.remove_client(gone), Status::ok) << ChunkManager::last_error();
  chunks.remove_observer(&book);
  for (TensorId id : ids) {
    EXPECT_FALSE(chunks.tensor_info(id).has_value());
    ASSERT_NE(book.find(id), nullptr);
    EXPECT_EQ(book.find(id)->location, Location::none);
    EXPECT_EQ(book.find(id)->address, nullptr);
  }
  EXPECT_TRUE(chunks.chunks_of(gone).empty());
  EXPECT_EQ(chunks.acquire(ids[0], {}, &ptr), Status::invalid_argument);
  // Device: the allocator got the client's chunks back; all it still hands
  // out is the kept client's chunk.
  EXPECT_EQ(rig.allocator->stats().allocated_bytes.current, allocated_before - gone_device);
  EXPECT_EQ(rig.allocator->stats().allocated_bytes.current,
            chunks.client_stats(keep).chunk_bytes_device);
  // Host: nothing of the removed client is in use; the cache can go too.
  EXPECT_EQ(chunks.host_pool_stats().in_use_bytes,
            host_in_use_before - static_cast<std::size_t>(gone_host));
  EXPECT_EQ(chunks.host_pool_stats().in_use_bytes, host_before.in_use_bytes);
  EXPECT_EQ(chunks.stats().chunk_bytes_host, chunks.client_stats(keep).chunk_bytes_host);
  EXPECT_EQ(chunks.stats().chunk_bytes_device, chunks.client_stats(keep).chunk_bytes_device);
  chunks.release_cached_host_memory();
  EXPECT_EQ(chunks.host_pool_stats().cached_bytes, 0u);
  EXPECT_LE(chunks.host_pool_stats().pinned_bytes, host_before.pinned_bytes);
  rig.allocator->empty_cache();
  EXPECT_EQ(rig.allocator->stats().reserved_bytes.current,
            chunks.client_stats(keep).chunk_bytes_device);  // at most the kept chunk's slab
  EXPECT_TRUE(equal_on_device(chunks, kept, kept_bytes));
}

TEST(ChunkObservers, AreToldEveryTensorsAddressOnEveryMove) {
  ChunkRigOptions options;
  options.chunk_budget = options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  AddressBook book;
  chunks.add_observer(&book);
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 1536 * KiB, "a");
  const TensorId a2 = register_ok(chunks, client, 100 * KiB, "a2", TensorKind::grad);
  const TensorId b = register_ok(chunks, client, 1536 * KiB, "b");
  write_on_device(chunks, a, random_bytes(1536 * KiB, 1));
  ASSERT_NE(book.find(a), nullptr);
  EXPECT_EQ(book.find(a)->location, Location::device);
  EXPECT_EQ(book.find(a)->address, chunks.tensor_info(a)->address);
  write_on_device(chunks, b, random_bytes(1536 * KiB, 2));  // evicts a's chunk
  EXPECT_EQ(book.find(a)->location, Location::host);
  EXPECT_EQ(book.find(a)->address, chunks.tensor_info(a)->address);
  EXPECT_EQ(book.find(b)->location, Location::device);
  EXPECT_EQ(book.find(a2), nullptr);  // its chunk never moved
  for (TensorId id : {a, b}) {
    EXPECT_EQ(book.find(id)->address, chunks.tensor_info(id)->address);
    EXPECT_EQ(book.find(id)->client, client);
  }
  chunks.remove_observer(&book);
}

TEST(ChunkRelayout, RepacksInTheGivenOrderAndKeepsTheBytes) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  AddressBook book;
  chunks.add_observer(&book);
  const ClientId client = chunks.add_client("model");
  std::vector<TensorId> ids;
  std::vector<std::vector<std::uint8_t>> expected;
  for (int i = 0; i < 10; ++i) {
    ids.push_back(register_ok(chunks, client, 600 * KiB, "t" + std::to_string(i)));
    expected.push_back(random_bytes(600 * KiB, 77 + i));
  }
  // Bytes on the device (dirty), on the host, and never written (t9).
  for (int i = 0; i < 9; ++i) write_on_device(chunks, ids[i], expected[i]);
  expected[9].assign(600 * KiB, 0);
  // First use order: reversed, odd ones first; t0 is left out.
  std::vector<TensorId> order;
  for (int i = 9; i >= 1; i -= 2) order.push_back(ids[i]);
  for (int i = 8; i >= 2; i -= 2) order.push_back(ids[i]);
  ASSERT_EQ(chunks.relayout(client, order), Status::ok) << ChunkManager::last_error();

  // Placement follows the order: t9, t7, t5 share the first chunk, ...
  const TensorInfo first = *chunks.tensor_info(ids[9]);
  EXPECT_EQ(first.offset, 0u);
  EXPECT_EQ(chunks.tensor_info(ids[7])->chunk, first.chunk);
  EXPECT_GT(chunks.tensor_info(ids[7])->offset, first.offset);
  EXPECT_GT(static_cast<unsigned>(chunks.tensor_info(ids[0])->chunk),
            static_cast<unsigned>(chunks.tensor_info(ids[2])->chunk));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(book.find(ids[i])->address, chunks.tensor_info(ids[i])->address) << i;
    EXPECT_TRUE(equal_on_device(chunks, ids[i], expected[i])) << i;
  }
  chunks.remove_observer(&book);
}

TEST(ChunkManagerOptions, ComeFromTheConfiguration) {
  ConfigResult parsed =
      parse_config("chunk_size:32MB,host_budget:3GiB,strict_residency:true,device:sim");
  ASSERT_TRUE(parsed.ok()) << parsed.error->message;
  const ChunkManagerOptions options = ChunkManagerOptions::from_config(*parsed.config);
  EXPECT_EQ(options.chunk_size, 32'000'000u);
  EXPECT_EQ(options.host_budget_bytes, std::size_t{3} << 30);
  EXPECT_TRUE(options.strict_residency);
  EXPECT_EQ(options.device_budget_bytes, std::numeric_limits<std::size_t>::max());
  // A fraction of RAM resolves to something between nothing and all of it.
  const ChunkManagerOptions defaults = ChunkManagerOptions::from_config(Config{});
  EXPECT_GT(defaults.host_budget_bytes, 0u);
  EXPECT_FALSE(defaults.strict_residency);
}

}  // namespace
}  // namespace spillway::testing
