// Note [Budget overruns]: an acquire for an op that must run comes in past the
// budget when every resident chunk is in compute, is counted and traced, keeps
// the bytes exact, and ends at the release; Note [The smallest budget]: the
// largest set of chunks one user needs at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "chunk_test_support.h"
#include "tests/support/recording_trace_sink.h"

namespace spillway::testing {
namespace {

using ::testing::HasSubstr;

void* acquire_overrunning(ChunkManager& chunks, TensorId id) {
  void* ptr = nullptr;
  EXPECT_EQ(
      chunks.acquire(id, {}, &ptr, AccessMode::read_write, WaitMode::host, OverBudget::overrun),
      Status::ok)
      << ChunkManager::last_error();
  return ptr;
}

// Two tensors that fill a chunk each, the budget one chunk: an op on both.
struct TwoChunkOp {
  explicit TwoChunkOp(ChunkRigOptions options) : rig(options) {
    const ClientId client = rig.chunks->add_client("model");
    weight = register_ok(*rig.chunks, client, 2 * MiB, "fc.weight");
    bias = register_ok(*rig.chunks, client, 2 * MiB, "fc.bias");
    write_on_device(*rig.chunks, weight, weight_bytes);
    write_on_device(*rig.chunks, bias, bias_bytes);
  }
  ChunkRig rig;
  TensorId weight{}, bias{};
  std::vector<std::uint8_t> weight_bytes = random_bytes(2 * MiB, 1);
  std::vector<std::uint8_t> bias_bytes = random_bytes(2 * MiB, 2);
};

TEST(ChunkBudgetOverrun, PastTheChunkBudgetCountedTracedAndEndedAtTheRelease) {
  RecordingTraceSink trace;
  ChunkRigOptions options;
  options.chunk_budget = 2 * MiB;
  options.trace = &trace;
  TwoChunkOp op(options);
  ChunkManager& chunks = *op.rig.chunks;

  void* weight = acquire_overrunning(chunks, op.weight);
  EXPECT_EQ(ChunkManager::last_overrun_bytes(), 0u);
  // Without permission to overrun, the second is refused as before.
  void* refused = nullptr;
  EXPECT_EQ(chunks.acquire(op.bias, {}, &refused, AccessMode::read, WaitMode::host),
            Status::out_of_memory);
  EXPECT_THAT(ChunkManager::last_error(), HasSubstr("none can be evicted"));
  void* bias = acquire_overrunning(chunks, op.bias);
  EXPECT_EQ(ChunkManager::last_overrun_bytes(), 2 * MiB);
  ASSERT_NE(weight, nullptr);
  ASSERT_NE(bias, nullptr);
  // Both resident at once, with their bytes.
  EXPECT_EQ(std::memcmp(weight, op.weight_bytes.data(), 2 * MiB), 0);
  EXPECT_EQ(std::memcmp(bias, op.bias_bytes.data(), 2 * MiB), 0);
  EXPECT_EQ(chunks.stats().chunk_bytes_device, static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(chunks.stats().budget_overruns, 1);
  const std::vector<TraceEvent> overruns = trace.of_kind(TraceEventKind::budget_overrun);
  ASSERT_EQ(overruns.size(), 1u);
  EXPECT_EQ(overruns[0].size, 2 * MiB);
  EXPECT_EQ(overruns[0].address, static_cast<std::uint64_t>(chunks.tensor_info(op.bias)->chunk));

  ASSERT_EQ(chunks.release(op.bias, {}), Status::ok);
  // The release ends the overrun as far as chunks out of compute allow.
  EXPECT_LE(chunks.stats().chunk_bytes_device, static_cast<std::int64_t>(2 * MiB));
  ASSERT_EQ(chunks.release(op.weight, {}), Status::ok);
  EXPECT_LE(chunks.stats().chunk_bytes_device, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(read_on_host(chunks, op.weight, 2 * MiB), op.weight_bytes);
  EXPECT_EQ(read_on_host(chunks, op.bias, 2 * MiB), op.bias_bytes);
}

TEST(ChunkBudgetOverrun, PastTheAllocatorBudgetTheSegmentGoesBackAfterwards) {
  ChunkRigOptions options;
  options.allocator_budget = 2 * MiB;  // no chunk cap: the allocator is the bound
  TwoChunkOp op(options);
  ChunkManager& chunks = *op.rig.chunks;
  void* weight = acquire_overrunning(chunks, op.weight);
  void* bias = acquire_overrunning(chunks, op.bias);
  EXPECT_GT(ChunkManager::last_overrun_bytes(), 0u);
  EXPECT_EQ(std::memcmp(weight, op.weight_bytes.data(), 2 * MiB), 0);
  EXPECT_EQ(std::memcmp(bias, op.bias_bytes.data(), 2 * MiB), 0);
  EXPECT_EQ(op.rig.allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(4 * MiB));
  EXPECT_EQ(op.rig.allocator->stats().num_ooms, 0);
  ASSERT_EQ(chunks.release(op.weight, {}), Status::ok);
  ASSERT_EQ(chunks.release(op.bias, {}), Status::ok);
  chunks.synchronize();
  // The evicted chunk's segment was freed after its write-back (deallocate_after);
  // the allocator's next call, once that copy is done, gives it back.
  void* activation = nullptr;
  ASSERT_EQ(op.rig.allocator->allocate(&activation, 512, Stream{}), Status::ok);
  ASSERT_EQ(op.rig.allocator->deallocate(activation), Status::ok);
  EXPECT_LE(op.rig.allocator->stats().reserved_bytes.current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(read_on_host(chunks, op.weight, 2 * MiB), op.weight_bytes);
  EXPECT_EQ(read_on_host(chunks, op.bias, 2 * MiB), op.bias_bytes);
}

TEST(ChunkBudgetOverrun, AChunkLargerThanTheWholeBudgetComesInForAnOp) {
  ChunkRigOptions options;
  options.chunk_budget = 4 * MiB;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const TensorId huge = register_ok(chunks, chunks.add_client("m"), 6 * MiB, "embedding.weight");
  void* ptr = acquire_overrunning(chunks, huge);
  EXPECT_NE(ptr, nullptr);
  EXPECT_EQ(ChunkManager::last_overrun_bytes(), 2 * MiB);
  ASSERT_EQ(chunks.release(huge, {}), Status::ok);
  EXPECT_EQ(chunks.stats().chunk_bytes_device, 0);
}

TEST(ChunkBudgetOverrun, FailsWhenTheDeviceHasNoRoomEvenPastTheBudget) {
  ChunkRigOptions options;
  options.allocator_budget = 2 * MiB;
  options.sim_capacity = 3 * MiB;
  TwoChunkOp op(options);
  ChunkManager& chunks = *op.rig.chunks;
  acquire_overrunning(chunks, op.weight);
  void* ptr = nullptr;
  EXPECT_EQ(
      chunks.acquire(op.bias, {}, &ptr, AccessMode::read, WaitMode::host, OverBudget::overrun),
      Status::out_of_memory);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_THAT(ChunkManager::last_error(), HasSubstr("past the budget"));
  ASSERT_EQ(chunks.release(op.weight, {}), Status::ok);
  // Nothing lost: both read back.
  EXPECT_EQ(read_on_host(chunks, op.weight, 2 * MiB), op.weight_bytes);
  EXPECT_EQ(read_on_host(chunks, op.bias, 2 * MiB), op.bias_bytes);
}

TEST(ChunkSmallestBudget, TheLargestSetOfDistinctChunksOneUserNeeds) {
  RecordingTraceSink trace;
  ChunkRigOptions options;
  options.trace = &trace;
  ChunkRig rig(options);
  ChunkManager& chunks = *rig.chunks;
  const ClientId client = chunks.add_client("m");
  const TensorId a = register_ok(chunks, client, 1 * MiB, "a");
  const TensorId b = register_ok(chunks, client, 512 * KiB, "b");  // a's chunk
  const TensorId c = register_ok(chunks, client, 2 * MiB, "c");    // a chunk of its own
  ASSERT_EQ(chunks.tensor_info(a)->chunk, chunks.tensor_info(b)->chunk);
  EXPECT_EQ(chunks.min_budget_bytes(), 0u);
  EXPECT_EQ(chunks.note_working_set(std::vector<TensorId>{a, b, a}, "aten::add"), 2 * MiB);
  EXPECT_EQ(chunks.note_working_set(std::vector<TensorId>{a, c}, "aten::addmm"), 4 * MiB);
  EXPECT_EQ(chunks.note_working_set(std::vector<TensorId>{c}, "aten::relu"), 2 * MiB);
  EXPECT_EQ(chunks.min_budget_bytes(), 4 * MiB);
  EXPECT_EQ(chunks.min_budget_user(), "aten::addmm");
  // Traced each time it grows.
  const std::vector<TraceEvent> grown = trace.of_kind(TraceEventKind::min_budget);
  ASSERT_EQ(grown.size(), 2u);
  EXPECT_EQ(grown[0].size, 2 * MiB);
  EXPECT_EQ(grown[1].size, 4 * MiB);
}

}  // namespace
}  // namespace spillway::testing
