// The chunk manager's packing rule (whole tensors, 256-byte alignment, best
// fit among a (kind, slot)'s newest chunks, capacities of what the chunks
// hold, oversized tensors alone) and the waste it leaves, on hand-made
// tensors and descriptions.
#include <gtest/gtest.h>

#include <algorithm>

#include "allocator/chunk/chunk_packer.h"
#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/model_tensors.h"

namespace spillway::chunksize {
namespace {

ModelTensor tensor(DataKind kind, std::uint64_t bytes, std::uint32_t slot = 0) {
  return {"t", 0, kind, slot, bytes};
}

TEST(ChunkPacking, WholeTensorsAlignedInChunksOfWhatTheyHold) {
  const Packing packing = pack_tensors(
      {tensor(DataKind::param, 300), tensor(DataKind::param, 300), tensor(DataKind::param, 300),
       tensor(DataKind::param, 500), tensor(DataKind::grad, 2000), tensor(DataKind::grad, 100)},
      1024);
  // 300 at 0, 300 at 512 (ends 812: capacity 1024); the third would start
  // at 1024: a new chunk; 500 joins it at 512 (ends 1012: 1024). The
  // 2000-byte grad gets a 2048-byte chunk of its own; the 100-byte grad
  // opens the grad run's first ordinary chunk, of 512 bytes.
  ASSERT_EQ(packing.chunks.size(), 4u);
  EXPECT_EQ(packing.tensor_chunk, (std::vector<plan::PlanChunk>{0, 0, 1, 1, 2, 3}));
  EXPECT_EQ(packing.tensor_offset, (std::vector<std::uint64_t>{0, 512, 0, 512, 0, 0}));
  EXPECT_EQ(packing.chunks[0].tensor_bytes, 600u);
  EXPECT_EQ(packing.chunks[1].tensor_bytes, 800u);
  EXPECT_EQ(packing.chunks[2].capacity, 2048u);
  EXPECT_TRUE(packing.chunks[2].own);
  EXPECT_EQ(packing.chunks[3].capacity, 512u);
  EXPECT_EQ(packing.own_chunks(), 1u);
  EXPECT_EQ(packing.capacity_bytes(), 1024u + 1024 + 2048 + 512);
  EXPECT_EQ(packing.waste_bytes(), 4608u - 3500);
  EXPECT_DOUBLE_EQ(packing.fill_ratio(), 3500.0 / 4608.0);
}

TEST(ChunkPacking, SlotsPackSeparatelyAndCapacityIsRoundedTo512) {
  const Packing packing = pack_tensors(
      {tensor(DataKind::optimizer_state, 100, 0), tensor(DataKind::optimizer_state, 100, 1),
       tensor(DataKind::optimizer_state, 100, 0)},
      1000);
  ASSERT_EQ(packing.chunks.size(), 2u);
  EXPECT_EQ(packing.tensor_chunk, (std::vector<plan::PlanChunk>{0, 1, 0}));
  EXPECT_EQ(packing.chunks[0].capacity, 512u);  // ends at 356
  EXPECT_EQ(packing.chunks[1].capacity, 512u);  // ends at 100
  EXPECT_EQ(packing.waste_bytes(), 1024u - 300);
}

TEST(ChunkPacking, ATensorJoinsTheOpenChunkItFillsBest) {
  // 500 opens chunk 0; 700 would end past 1024 there (512 + 700): chunk 1.
  // 200 fits both: at 768 in chunk 1 it leaves 56 bytes, at 512 in chunk 0
  // 312: chunk 1. 300 fits only chunk 0 (at 512), the older one.
  const Packing packing = pack_tensors({tensor(DataKind::param, 500), tensor(DataKind::param, 700),
                                        tensor(DataKind::param, 200), tensor(DataKind::param, 300)},
                                       1024);
  ASSERT_EQ(packing.chunks.size(), 2u);
  EXPECT_EQ(packing.tensor_chunk, (std::vector<plan::PlanChunk>{0, 1, 1, 0}));
  EXPECT_EQ(packing.tensor_offset, (std::vector<std::uint64_t>{0, 0, 768, 512}));
  EXPECT_EQ(packing.chunks[0].capacity, 1024u);  // ends at 812
  EXPECT_EQ(packing.chunks[1].capacity, 1024u);  // ends at 968
}

TEST(ChunkPacking, OnlyTheNewestChunksOfAGroupAreOpen) {
  // In 2048-byte chunks: 1500 opens chunk 0; each 1100 opens one more (it
  // would start at 1536 or 1280). A 500 fits best in chunk 0 (at 1536, 12
  // bytes left; 268 in the others), while chunk 0 is among the last
  // kOpenChunks.
  const auto pack = [](std::size_t followers) {
    std::vector<ModelTensor> tensors{tensor(DataKind::param, 1500)};
    for (std::size_t i = 0; i < followers; ++i) tensors.push_back(tensor(DataKind::param, 1100));
    tensors.push_back(tensor(DataKind::param, 500));
    return pack_tensors(tensors, 2048);
  };
  const Packing open = pack(ChunkPacker::kOpenChunks - 1);
  ASSERT_EQ(open.chunks.size(), ChunkPacker::kOpenChunks);
  EXPECT_EQ(open.tensor_chunk.back(), 0u);
  EXPECT_EQ(open.tensor_offset.back(), 1536u);
  // One more chunk and chunk 0 is closed: the 500 joins the newest.
  const Packing closed = pack(ChunkPacker::kOpenChunks);
  ASSERT_EQ(closed.chunks.size(), ChunkPacker::kOpenChunks + 1);
  EXPECT_EQ(closed.tensor_chunk.back(), ChunkPacker::kOpenChunks);
  EXPECT_EQ(closed.tensor_offset.back(), 1280u);
}

TEST(ChunkPacking, WasteOfAHandMadeDescription) {
  const sim::ModelSpec model = sim::parse_model(R"({"layers": [
      {"name": "a", "param_bytes": 3000000, "forward_ns": 1},
      {"name": "b", "param_bytes": 3000000, "forward_ns": 1},
      {"name": "c", "param_bytes": 3000000, "forward_ns": 1}]})");
  const std::vector<ModelTensor> tensors = model_tensors(model);
  ASSERT_EQ(tensors.size(), 6u);  // a param and a grad per layer
  // Per kind in 8 MiB chunks: a at 0, b at 3000064 (ends 6000064: capacity
  // 6000128), c would end at 9000128, past 8388608: a second chunk, of
  // 3000320. Two kinds, two chunks each.
  const Packing packing = pack_tensors(tensors, 8 << 20);
  EXPECT_EQ(packing.chunks.size(), 4u);
  EXPECT_EQ(packing.waste_bytes(), 2u * (6000128 + 3000320) - 18000000);
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
