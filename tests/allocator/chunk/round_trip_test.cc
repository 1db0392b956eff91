// Bytes survive being cycled through a budget far smaller than the data:
// written by "kernels" on a compute stream, evicted, fetched, checked by
// kernels again, with modelled copy bandwidth and delays so that any missing
// event wait reads the wrong bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

struct TensorCase {
  TensorId id;
  std::vector<std::uint8_t> bytes;
};

class ChunkRoundTripTest : public ::testing::TestWithParam<bool> {};

// Many chunks through a three-chunk budget, every access on a compute stream
// that only waits for the fetch's event (WaitMode::stream).
TEST_P(ChunkRoundTripTest, ManyChunksThroughATinyBudgetComeBackBitIdentical) {
  const bool copy_delay = GetParam();
  ChunkRigOptions options;
  options.chunk_budget = 3 * options.chunk_size;
  ChunkRig rig(options);
  if (copy_delay) rig.device->set_copy_delay_ns(300'000);
  ChunkManager& chunks = *rig.chunks;
  Stream compute;
  ASSERT_EQ(rig.device->create_stream(&compute), Status::ok);
  KernelQueue kernels(*rig.device);

  const ClientId client = chunks.add_client("model");
  std::mt19937_64 random(42);
  std::vector<TensorCase> tensors;
  for (int i = 0; i < 48; ++i) {
    const std::size_t bytes = std::uniform_int_distribution<std::size_t>(1, 900 * KiB)(random);
    tensors.push_back(
        {register_ok(chunks, client, bytes, "t" + std::to_string(i)), random_bytes(bytes, i)});
  }
  ASSERT_GE(chunks.chunks_of(client).size(), 10u);

  // Write every tensor through a kernel.
  for (TensorCase& tensor : tensors) {
    void* ptr = nullptr;
    ASSERT_EQ(chunks.acquire(tensor.id, compute, &ptr), Status::ok) << ChunkManager::last_error();
    kernels.write(compute, ptr, tensor.bytes);
    ASSERT_EQ(chunks.release(tensor.id, compute), Status::ok);
  }
  // Rounds in random order: check every tensor; rewrite some.
  for (int round = 0; round < 4; ++round) {
    std::shuffle(tensors.begin(), tensors.end(), random);
    for (TensorCase& tensor : tensors) {
      const bool rewrite = std::bernoulli_distribution(0.3)(random);
      void* ptr = nullptr;
      ASSERT_EQ(chunks.acquire(tensor.id, compute, &ptr,
                               rewrite ? AccessMode::read_write : AccessMode::read),
                Status::ok)
          << ChunkManager::last_error();
      kernels.check(compute, ptr, tensor.bytes, "round " + std::to_string(round));
      if (rewrite) {
        tensor.bytes = random_bytes(tensor.bytes.size(), random());
        kernels.write(compute, ptr, tensor.bytes);
      }
      ASSERT_EQ(chunks.release(tensor.id, compute), Status::ok);
    }
  }
  rig.device->synchronize_stream(compute);
  EXPECT_EQ(kernels.mismatches(), 0);
  // And through the host path, independent of the device copies.
  for (TensorCase& tensor : tensors) {
    EXPECT_EQ(read_on_host(chunks, tensor.id, tensor.bytes.size()), tensor.bytes);
  }
  const ChunkStats stats = chunks.stats();
  EXPECT_GT(stats.evictions, 40);
  EXPECT_GT(stats.writebacks, 0);
  EXPECT_LE(static_cast<std::size_t>(stats.chunk_bytes_device), 3 * options.chunk_size);
  rig.device->synchronize();
  rig.device->destroy_stream(compute);
}

INSTANTIATE_TEST_SUITE_P(CopyDelay, ChunkRoundTripTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "delayed" : "modelled"; });

// The host-blocking protocol (WaitMode::host), as code that reads device
// memory from the host uses it.
TEST(ChunkRoundTrip, HostWaitedAccessComesBackBitIdentical) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  rig.device->set_copy_delay_ns(200'000);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  std::vector<TensorCase> tensors;
  for (int i = 0; i < 16; ++i) {
    const std::size_t bytes = 700 * KiB + i * 4 * KiB;
    tensors.push_back(
        {register_ok(chunks, client, bytes, "t" + std::to_string(i)), random_bytes(bytes, i)});
  }
  for (TensorCase& tensor : tensors) write_on_device(chunks, tensor.id, tensor.bytes);
  for (int round = 0; round < 3; ++round) {
    for (TensorCase& tensor : tensors) {
      EXPECT_TRUE(equal_on_device(chunks, tensor.id, tensor.bytes)) << round;
    }
  }
  EXPECT_GT(chunks.stats().stall_ns, 0);  // host waits are stalls
}

TEST(ChunkRoundTrip, NeverWrittenTensorsReadAsZeros) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 3000, "a");
  const TensorId b = register_ok(chunks, client, 5 * MiB, "big", TensorKind::grad);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::none);
  EXPECT_TRUE(equal_on_device(chunks, a, std::vector<std::uint8_t>(3000, 0)));
  EXPECT_EQ(read_on_host(chunks, b, 5 * MiB), std::vector<std::uint8_t>(5 * MiB, 0));
}

// Note [A chunk without bytes is zeroed on the device]: its fetch copies
// nothing over the link, and what is written after it survives an eviction.
TEST(ChunkRoundTrip, AChunkWithBytesNowhereIsZeroedOnTheDeviceNotCopied) {
  ChunkRigOptions options;
  options.chunk_budget = options.chunk_size;  // one chunk on the device at a time
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 600 * KiB, "a", TensorKind::grad);
  const TensorId b = register_ok(chunks, client, 700 * KiB, "b", TensorKind::grad);
  const TensorId other = register_ok(chunks, client, 2 * MiB, "other");
  const std::vector<std::uint8_t> zeros(600 * KiB, 0);
  EXPECT_TRUE(equal_on_device(chunks, a, zeros));
  EXPECT_EQ(chunks.stats().bytes_moved_h2d, 0);
  EXPECT_EQ(chunks.stats().fetches, 1);
  EXPECT_EQ(chunks.stats().chunk_bytes_host, 0);  // no host copy was made for it

  const std::vector<std::uint8_t> a_bytes = random_bytes(600 * KiB, 7);
  write_on_device(chunks, a, a_bytes);
  write_on_device(chunks, other, random_bytes(2 * MiB, 8));  // evicts a's chunk
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::host);
  EXPECT_GT(chunks.stats().bytes_moved_d2h, 0);
  const std::int64_t before = chunks.stats().bytes_moved_h2d;
  EXPECT_TRUE(equal_on_device(chunks, a, a_bytes));  // a real fetch now
  EXPECT_GT(chunks.stats().bytes_moved_h2d, before);

  // Every tensor discarded: zeros again, and again without a copy.
  ASSERT_EQ(chunks.discard(a), Status::ok);
  ASSERT_EQ(chunks.discard(b), Status::ok);
  write_on_device(chunks, other, random_bytes(2 * MiB, 9));
  const std::int64_t moved = chunks.stats().bytes_moved_h2d;
  EXPECT_TRUE(equal_on_device(chunks, b, std::vector<std::uint8_t>(700 * KiB, 0)));
  EXPECT_TRUE(equal_on_device(chunks, a, zeros));
  EXPECT_EQ(chunks.stats().bytes_moved_h2d, moved);
}

// A tensor discarded again, not used since, leaves its chunk as it is: the
// chunk zeroed on the device meanwhile (by a prefetch for a coming use)
// keeps that copy instead of being dropped and zeroed once more.
TEST(ChunkRoundTrip, DiscardingADiscardedTensorAgainKeepsItsZeroedChunk) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 600 * KiB, "a", TensorKind::grad);
  write_on_device(chunks, a, random_bytes(600 * KiB, 3));
  ASSERT_EQ(chunks.discard(a), Status::ok);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::none);
  ASSERT_EQ(chunks.prefetch(a), Status::ok);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::device);
  const std::int64_t fetches = chunks.stats().fetches;
  ASSERT_EQ(chunks.discard(a), Status::ok);
  EXPECT_EQ(chunks.tensor_info(a)->location, Location::device) << "the zeroed copy was dropped";
  EXPECT_TRUE(equal_on_device(chunks, a, std::vector<std::uint8_t>(600 * KiB, 0)));
  EXPECT_EQ(chunks.stats().fetches, fetches) << "the use zeroed the chunk again";
}

// A zero-filled chunk read on the host: its device copy is the only one, so
// acquire_host writes it back first.
TEST(ChunkRoundTrip, AZeroFilledChunkReadsAsZerosOnTheHost) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId a = register_ok(chunks, client, 5000, "a");
  EXPECT_TRUE(equal_on_device(chunks, a, std::vector<std::uint8_t>(5000, 0)));
  EXPECT_EQ(read_on_host(chunks, a, 5000), std::vector<std::uint8_t>(5000, 0));
}

TEST(ChunkRoundTrip, OversizeTensorsGetAChunkOfTheirOwn) {
  ChunkRigOptions options;
  options.chunk_budget = 8 * MiB;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId small = register_ok(chunks, client, 1000, "small");
  const TensorId big = register_ok(chunks, client, 5 * MiB + 3, "big");
  const TensorId after = register_ok(chunks, client, 1000, "after");
  const TensorInfo big_info = *chunks.tensor_info(big);
  EXPECT_NE(big_info.chunk, chunks.tensor_info(small)->chunk);
  EXPECT_EQ(chunks.tensor_info(after)->chunk, chunks.tensor_info(small)->chunk);
  EXPECT_EQ(chunks.chunk_info(big_info.chunk)->tensor_count, 1u);
  EXPECT_GE(chunks.chunk_info(big_info.chunk)->capacity_bytes, 5 * MiB + 3);

  const auto big_bytes = random_bytes(5 * MiB + 3, 7);
  const auto small_bytes = random_bytes(1000, 8);
  write_on_device(chunks, big, big_bytes);
  write_on_device(chunks, small, small_bytes);
  for (ChunkId id : chunks.chunks_of(client)) ASSERT_EQ(chunks.evict(id), Status::ok);
  EXPECT_TRUE(equal_on_device(chunks, big, big_bytes));
  EXPECT_TRUE(equal_on_device(chunks, small, small_bytes));
}

}  // namespace
}  // namespace spillway::testing
