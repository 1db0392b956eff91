// strict_residency: a tensor whose chunk left the device points at memory
// that faults, so a read that missed its acquire crashes instead of reading
// stale bytes.
#include <gtest/gtest.h>

#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

class ChunkStrictResidencyDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The device's stream threads exist: re-execute rather than fork.
    GTEST_FLAG_SET(death_test_style, "threadsafe");
  }
};

TEST_F(ChunkStrictResidencyDeathTest, ReadingThroughAStalePointerAfterEvictionFaults) {
  ChunkRigOptions options;
  options.strict_residency = true;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId w = register_ok(chunks, client, 64 * KiB, "w");
  const auto bytes = random_bytes(64 * KiB, 1);

  // Never accessed: already inaccessible, not null.
  const TensorInfo fresh = *chunks.tensor_info(w);
  ASSERT_NE(fresh.address, nullptr);
  EXPECT_DEATH(
      {
        volatile const char* stale = static_cast<const char*>(fresh.address);
        (void)*stale;
      },
      "");

  write_on_device(chunks, w, bytes);
  const TensorInfo resident = *chunks.tensor_info(w);
  EXPECT_EQ(std::memcmp(resident.address, bytes.data(), bytes.size()), 0);  // readable now
  ASSERT_EQ(chunks.evict(resident.chunk), Status::ok);
  const TensorInfo evicted = *chunks.tensor_info(w);
  EXPECT_EQ(evicted.location, Location::host);
  EXPECT_NE(evicted.address, resident.address);
  // What a bridge would have rebound the tensor to: reading it faults.
  EXPECT_DEATH(
      {
        volatile const char* stale = static_cast<const char*>(evicted.address) + 1000;
        (void)*stale;
      },
      "");
  // The bytes themselves are safe, and a fetch makes the tensor readable again.
  EXPECT_TRUE(equal_on_device(chunks, w, bytes));
}

TEST(ChunkStrictResidency, OffMeansEvictedTensorsPointAtTheirHostCopy) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("model");
  const TensorId w = register_ok(chunks, client, 64 * KiB, "w");
  EXPECT_EQ(chunks.tensor_info(w)->address, nullptr);
  const auto bytes = random_bytes(64 * KiB, 1);
  write_on_device(chunks, w, bytes);
  ASSERT_EQ(chunks.evict(chunks.tensor_info(w)->chunk), Status::ok);
  chunks.synchronize();
  const TensorInfo evicted = *chunks.tensor_info(w);
  EXPECT_EQ(std::memcmp(evicted.address, bytes.data(), bytes.size()), 0);
}

}  // namespace
}  // namespace spillway::testing
