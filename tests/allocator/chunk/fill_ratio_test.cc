// chunk_fill_ratio: the bytes of the managed tensors over the capacity of
// their chunks, for every client and each, as the layout changes (a chunk
// that has bytes takes no more tensors; a removed client's chunks go).
// Capacities here follow Note [Packing tensors], worked out by hand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chunk_test_support.h"

namespace spillway::testing {
namespace {

TEST(ChunkFillRatio, TensorBytesOverChunkBytesOfEveryClient) {
  ChunkRig rig;  // 2 MiB chunks
  ChunkManager& chunks = *rig.chunks;
  const ClientId actor = chunks.add_client("actor");
  const ClientId critic = chunks.add_client("critic");
  EXPECT_EQ(chunks.stats().capacity_bytes, 0);
  EXPECT_EQ(chunks.stats().fill_ratio(), 0.0);  // no chunks yet

  // actor params: 1000 at 0, 3000 at 1024 (ends 4024: a 4096-byte chunk).
  // actor grad: 5 MiB, larger than a chunk: one of exactly its size.
  const TensorId first = register_ok(chunks, actor, 1000, "actor.w");
  register_ok(chunks, actor, 3000, "actor.b");
  register_ok(chunks, actor, 5 * MiB, "actor.w.grad", TensorKind::grad);
  // critic params: two 1 MiB tensors fill a 2 MiB chunk; 100 bytes open
  // another, of 512 bytes.
  register_ok(chunks, critic, MiB, "critic.w1");
  register_ok(chunks, critic, MiB, "critic.w2");
  register_ok(chunks, critic, 100, "critic.b");

  const std::int64_t actor_capacity = 4096 + 5 * MiB;
  const std::int64_t actor_tensors = 1000 + 3000 + 5 * MiB;
  const std::int64_t critic_capacity = 2 * MiB + 512;
  const std::int64_t critic_tensors = 2 * MiB + 100;
  EXPECT_EQ(chunks.client_stats(actor).capacity_bytes, actor_capacity);
  EXPECT_EQ(chunks.client_stats(actor).tensor_bytes, actor_tensors);
  EXPECT_EQ(chunks.client_stats(critic).capacity_bytes, critic_capacity);
  EXPECT_EQ(chunks.client_stats(critic).tensor_bytes, critic_tensors);
  const ChunkStats all = chunks.stats();
  EXPECT_EQ(all.capacity_bytes, actor_capacity + critic_capacity);
  EXPECT_EQ(all.tensor_bytes, actor_tensors + critic_tensors);
  EXPECT_DOUBLE_EQ(all.fill_ratio(), static_cast<double>(actor_tensors + critic_tensors) /
                                         static_cast<double>(actor_capacity + critic_capacity));

  // Under the contract keys, and in the JSON as chunk_fill_ratio.
  Stats stats;
  all.add_to(&stats);
  EXPECT_EQ(stats.chunk_bytes_capacity, actor_capacity + critic_capacity);
  EXPECT_EQ(stats.chunk_bytes_tensors, actor_tensors + critic_tensors);
  EXPECT_DOUBLE_EQ(stats.chunk_fill_ratio(), all.fill_ratio());
  const nlohmann::json json = nlohmann::json::parse(stats.to_json());
  ASSERT_TRUE(json.contains("chunk_fill_ratio"));
  EXPECT_DOUBLE_EQ(json["chunk_fill_ratio"].get<double>(), all.fill_ratio());
  EXPECT_EQ(json["chunk_bytes.capacity"].get<std::int64_t>(), actor_capacity + critic_capacity);

  // Once the actor's param chunk has bytes it is sealed at 4096 bytes: a new
  // 100-byte param opens a chunk of its own (512 bytes) instead of joining.
  write_on_device(chunks, first, random_bytes(1000, 1));
  register_ok(chunks, actor, 100, "actor.c");
  EXPECT_EQ(chunks.client_stats(actor).capacity_bytes, actor_capacity + 512);
  EXPECT_EQ(chunks.client_stats(actor).tensor_bytes, actor_tensors + 100);

  // Removing the critic takes its chunks out of the figures.
  ASSERT_EQ(chunks.remove_client(critic), Status::ok) << ChunkManager::last_error();
  EXPECT_EQ(chunks.stats().capacity_bytes, actor_capacity + 512);
  EXPECT_EQ(chunks.stats().tensor_bytes, actor_tensors + 100);
}

TEST(ChunkFillRatio, RelayoutKeepsEveryTensorAndPacksAnew) {
  ChunkRig rig;
  ChunkManager& chunks = *rig.chunks;
  const ClientId model = chunks.add_client("model");
  // 1.5 MiB, 1 MiB, 0.5 MiB in registration order: 1.5 MiB opens chunk 0,
  // 1 MiB opens chunk 1, 0.5 MiB fits both and fills chunk 0 exactly (best
  // fit): two chunks, 2 MiB and 1 MiB.
  const TensorId a = register_ok(chunks, model, 1536 * KiB, "a");
  const TensorId b = register_ok(chunks, model, 1024 * KiB, "b");
  const TensorId c = register_ok(chunks, model, 512 * KiB, "c");
  EXPECT_EQ(chunks.tensor_info(c)->chunk, chunks.tensor_info(a)->chunk);
  EXPECT_EQ(chunks.stats().capacity_bytes, 3 * MiB);
  EXPECT_DOUBLE_EQ(chunks.stats().fill_ratio(), 1.0);
  // b, c, a: b and c share a 1.5 MiB chunk, a opens a 1.5 MiB one.
  const std::vector<TensorId> order{b, c, a};
  ASSERT_EQ(chunks.relayout(model, order), Status::ok) << ChunkManager::last_error();
  EXPECT_EQ(chunks.tensor_info(b)->chunk, chunks.tensor_info(c)->chunk);
  EXPECT_EQ(chunks.stats().capacity_bytes, 3 * MiB);
  EXPECT_EQ(chunks.stats().tensor_bytes, 3 * MiB);
  EXPECT_EQ(chunks.chunks_of(model).size(), 2u);
}

}  // namespace
}  // namespace spillway::testing
