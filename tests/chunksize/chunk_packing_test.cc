// The chunk manager's packing rule (whole tensors, 256-byte alignment, one
// open chunk per (kind, slot), oversized tensors alone) and the waste it
// leaves, on hand-made tensors and descriptions.
#include <gtest/gtest.h>

#include <algorithm>

#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/model_tensors.h"

namespace spillway::chunksize {
namespace {

ModelTensor tensor(DataKind kind, std::uint64_t bytes, std::uint32_t slot = 0) {
  return {"t", 0, kind, slot, bytes};
}

TEST(ChunkPacking, WholeTensorsAlignedOneOpenChunkPerKind) {
  const Packing packing = pack_tensors(
      {tensor(DataKind::param, 300), tensor(DataKind::param, 300), tensor(DataKind::param, 300),
       tensor(DataKind::param, 500), tensor(DataKind::grad, 2000), tensor(DataKind::grad, 100)},
      1024);
  // 300 at 0, 300 at 512 (ends 812); the third would start at 1024: new
  // chunk; 500 joins it at 512. The 2000-byte grad gets a 2048-byte chunk of
  // its own; the 100-byte grad opens the grad run's first ordinary chunk.
  ASSERT_EQ(packing.chunks.size(), 4u);
  EXPECT_EQ(packing.tensor_chunk, (std::vector<plan::PlanChunk>{0, 0, 1, 1, 2, 3}));
  EXPECT_EQ(packing.chunks[0].tensor_bytes, 600u);
  EXPECT_EQ(packing.chunks[1].tensor_bytes, 800u);
  EXPECT_EQ(packing.chunks[2].capacity, 2048u);
  EXPECT_TRUE(packing.chunks[2].own);
  EXPECT_EQ(packing.own_chunks(), 1u);
  EXPECT_EQ(packing.capacity_bytes(), 1024u + 1024 + 2048 + 1024);
  EXPECT_EQ(packing.waste_bytes(), 5120u - 3500);
}

TEST(ChunkPacking, SlotsPackSeparatelyAndCapacityIsRoundedTo512) {
  const Packing packing = pack_tensors(
      {tensor(DataKind::optimizer_state, 100, 0), tensor(DataKind::optimizer_state, 100, 1),
       tensor(DataKind::optimizer_state, 100, 0)},
      1000);
  ASSERT_EQ(packing.chunks.size(), 2u);
  EXPECT_EQ(packing.tensor_chunk, (std::vector<plan::PlanChunk>{0, 1, 0}));
  EXPECT_EQ(packing.chunks[0].capacity, 1024u);
  EXPECT_EQ(packing.waste_bytes(), 2048u - 300);
}

TEST(ChunkPacking, WasteOfAHandMadeDescription) {
  const sim::ModelSpec model = sim::parse_model(R"({"layers": [
      {"name": "a", "param_bytes": 3000000, "forward_ns": 1},
      {"name": "b", "param_bytes": 3000000, "forward_ns": 1},
      {"name": "c", "param_bytes": 3000000, "forward_ns": 1}]})");
  const std::vector<ModelTensor> tensors = model_tensors(model);
  ASSERT_EQ(tensors.size(), 6u);  // a param and a grad per layer
  // Per kind in 8 MiB chunks: a at 0, b at 3000064 (ends 6000064), c would
  // start at 6000128 and end past 8388608: a second chunk. Two kinds, two
  // chunks each.
  const Packing packing = pack_tensors(tensors, 8 << 20);
  EXPECT_EQ(packing.chunks.size(), 4u);
  EXPECT_EQ(packing.waste_bytes(), 4u * 8388608 - 18000000);
  // In 9 MB chunks all three fit (c ends at 9000128 <= 9000448, rounded to 512).
  const Packing wide = pack_tensors(tensors, 9'000'000);
  EXPECT_EQ(wide.chunks.size(), 2u);
  EXPECT_EQ(wide.waste_bytes(), 2u * 9000448 - 18000000);
}

TEST(ModelTensors, GptBlocksAreFourMatricesInFiveKinds) {
  const sim::ModelSpec model = sim::gpt_model({2, 1024, 512, 1});
  const std::vector<ModelTensor> tensors = model_tensors(model);
  ASSERT_EQ(tensors.size(), 2u * 5 * 4);
  std::uint64_t bytes = 0, largest = 0;
  for (const ModelTensor& t : tensors) {
    bytes += t.bytes;
    largest = std::max(largest, t.bytes);
  }
  EXPECT_EQ(bytes, model.model_bytes());
  EXPECT_EQ(largest, 4u * 1024 * 1024 * 4);  // the MLP's fp32 master (and moments)
  EXPECT_EQ(tensors[2].name, "block0.mlp_in.param");
}

}  // namespace
}  // namespace spillway::chunksize
