// The pinned host pool: lazy, capped by host_budget, cached by size, and
// falling back to pageable memory with one warning when pinning fails.
#include <gtest/gtest.h>

#include <gmock/gmock.h>

#include "allocator/chunk/host_pool.h"
#include "allocator/config/log.h"
#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

using ::testing::HasSubstr;

int count_of(const std::string& text, const std::string& needle) {
  int count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

TEST(ChunkHostPool, PinsLazilyAndReusesGivenBackBlocks) {
  SimDevice device;
  HostPool pool(device, 16 * MiB);
  EXPECT_EQ(pool.stats().pinned_bytes, 0u);
  HostBlock a;
  ASSERT_EQ(pool.allocate(3 * MiB, &a), Status::ok);
  EXPECT_TRUE(a.pinned);
  EXPECT_EQ(pool.stats().pinned_bytes, 3 * MiB);
  pool.deallocate(a);
  EXPECT_EQ(pool.stats().cached_bytes, 3 * MiB);
  HostBlock b;
  ASSERT_EQ(pool.allocate(3 * MiB, &b), Status::ok);
  EXPECT_EQ(b.data, a.data);
  EXPECT_EQ(pool.stats().pinned_bytes, 3 * MiB);
  pool.deallocate(b);
  pool.release_cached();
  EXPECT_EQ(pool.stats().pinned_bytes, 0u);
  EXPECT_EQ(pool.stats().cached_bytes, 0u);
}

TEST(ChunkHostPool, PastTheBudgetServesPageableMemoryWithOneWarning) {
  SimDevice device;
  HostPool pool(device, 4 * MiB);
  ::testing::internal::CaptureStderr();
  std::vector<HostBlock> blocks(4);
  for (HostBlock& block : blocks) ASSERT_EQ(pool.allocate(2 * MiB, &block), Status::ok);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(blocks[0].pinned && blocks[1].pinned);
  EXPECT_FALSE(blocks[2].pinned || blocks[3].pinned);
  EXPECT_EQ(count_of(log, "spillway[warn]"), 1) << log;
  EXPECT_THAT(log, HasSubstr("host_budget of 4.00 MiB"));
  EXPECT_EQ(pool.stats().pinned_bytes, 4 * MiB);
  EXPECT_EQ(pool.stats().pageable_bytes, 4 * MiB);
  for (HostBlock& block : blocks) pool.deallocate(block);
}

// SimDevice refuses to pin once (as a memlock limit would); the chunk
// manager carries on in pageable memory, warns once, and keeps exact data.
TEST(ChunkHostPool, PinningFailureFallsBackToPageableMemoryWithExactlyOneWarning) {
  ChunkRigOptions options;
  options.chunk_budget = 2 * options.chunk_size;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  std::vector<TensorId> ids;
  std::vector<std::vector<std::uint8_t>> expected;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(register_ok(chunks, client, 1536 * KiB, "w" + std::to_string(i)));
    expected.push_back(random_bytes(1536 * KiB, i));
  }
  write_on_device(chunks, ids[0], expected[0]);
  // Its write-back takes a pinned host copy, before the fault.
  ASSERT_EQ(chunks.evict(chunks.tensor_info(ids[0])->chunk), Status::ok);
  rig.device->fail_nth_host_malloc(1);
  ::testing::internal::CaptureStderr();
  for (int round = 0; round < 2; ++round) {
    for (std::size_t i = 1; i < ids.size(); ++i) write_on_device(chunks, ids[i], expected[i]);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(equal_on_device(chunks, ids[i], expected[i])) << i;
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(log, "spillway[warn]"), 1) << log;
  EXPECT_THAT(log, HasSubstr("pageable"));
  EXPECT_THAT(log, HasSubstr("injected fault"));
  EXPECT_EQ(rig.chunks->host_pool_stats().pin_failures, 1u);
  EXPECT_TRUE(chunks.chunk_info(chunks.tensor_info(ids[0])->chunk)->pinned_host);
  EXPECT_FALSE(chunks.chunk_info(chunks.tensor_info(ids[1])->chunk)->pinned_host);
  EXPECT_FALSE(chunks.chunk_info(chunks.tensor_info(ids[5])->chunk)->pinned_host);
  EXPECT_GT(rig.chunks->host_pool_stats().pageable_bytes, 0u);
}

}  // namespace
}  // namespace spillway::testing
