// The chunk manager and spillway-chunksize pack tensors the same way, because
// both use ChunkPacker (allocator/chunk/chunk_packer.h): the same tensors,
// registered with a chunk manager and packed by pack_tensors, give the same
// chunks (order, kind, slot, capacity) and put each tensor in the same chunk
// at the same offset.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "allocator/config/config.h"
#include "tests/allocator/chunk/chunk_test_support.h"
#include "tools/chunksize/chunk_packing.h"
#include "tools/chunksize/chunk_size_search.h"
#include "tools/chunksize/model_tensors.h"

namespace spillway::testing {
namespace {

TensorKind tensor_kind(chunksize::DataKind kind) {
  switch (kind) {
    case chunksize::DataKind::param:
      return TensorKind::param;
    case chunksize::DataKind::grad:
      return TensorKind::grad;
    case chunksize::DataKind::master:
      return TensorKind::master;
    case chunksize::DataKind::optimizer_state:
      return TensorKind::optimizer_state;
  }
  return TensorKind::param;
}

// Tensors of every kind, two optimizer-state slots, mostly below a third of a
// chunk and some larger than a whole one.
std::vector<chunksize::ModelTensor> random_tensors(std::size_t chunk_size, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<chunksize::ModelTensor> tensors;
  for (int i = 0; i < 300; ++i) {
    const auto kind = static_cast<chunksize::DataKind>(random() % 4);
    const std::uint32_t slot =
        kind == chunksize::DataKind::optimizer_state ? static_cast<std::uint32_t>(random() % 2) : 0;
    const std::uint64_t bytes =
        random() % 10 == 0 ? 1 + random() % (5 * chunk_size / 2) : 1 + random() % (chunk_size / 3);
    tensors.push_back({"t" + std::to_string(i), 0, kind, slot, bytes});
  }
  return tensors;
}

// Registers `tensors` with a chunk manager of `chunk_size` (one client).
ClientId register_all(ChunkManager& chunks, const std::vector<chunksize::ModelTensor>& tensors,
                      std::vector<TensorId>* ids) {
  const ClientId client = chunks.add_client("model");
  for (const chunksize::ModelTensor& tensor : tensors) {
    TensorSpec spec;
    spec.kind = tensor_kind(tensor.kind);
    spec.slot = tensor.slot;
    spec.dtype_bytes = 1;
    spec.element_count = tensor.bytes;
    spec.name = tensor.name;
    TensorId id{};
    EXPECT_EQ(chunks.register_tensor(client, spec, &id), Status::ok) << ChunkManager::last_error();
    ids->push_back(id);
  }
  return client;
}

TEST(ChunkPackingAgreement, TheChunkManagerAndTheChunkSizeSearchPackAlike) {
  for (std::size_t chunk_size : {std::size_t{4096}, std::size_t{65536}, MiB + 100}) {
    SCOPED_TRACE(::testing::Message() << "chunk_size " << chunk_size);
    const std::vector<chunksize::ModelTensor> tensors = random_tensors(chunk_size, chunk_size);
    ChunkRigOptions options;
    options.chunk_size = chunk_size;
    ChunkRig rig(options);
    std::vector<TensorId> ids;
    const ClientId client = register_all(*rig.chunks, tensors, &ids);
    ASSERT_EQ(ids.size(), tensors.size());
    const chunksize::Packing packing = chunksize::pack_tensors(tensors, chunk_size);

    // One client: the manager's chunks are its chunks, in creation order.
    const std::vector<ChunkId> chunks = rig.chunks->chunks_of(client);
    ASSERT_EQ(chunks.size(), packing.chunks.size());
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const std::optional<ChunkInfo> info = rig.chunks->chunk_info(chunks[c]);
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->capacity_bytes, packing.chunks[c].capacity) << "chunk " << c;
      EXPECT_EQ(info->kind, tensor_kind(packing.chunks[c].kind)) << "chunk " << c;
      EXPECT_EQ(info->slot, packing.chunks[c].slot) << "chunk " << c;
    }
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const std::optional<TensorInfo> info = rig.chunks->tensor_info(ids[t]);
      ASSERT_TRUE(info.has_value());
      EXPECT_EQ(info->chunk, chunks[packing.tensor_chunk[t]]) << tensors[t].name;
      EXPECT_EQ(info->offset, packing.tensor_offset[t]) << tensors[t].name;
    }
    EXPECT_DOUBLE_EQ(rig.chunks->stats().fill_ratio(), packing.fill_ratio());
  }
}

// Issue 18's requirement: chunk_fill_ratio >= 0.90 with the default layout
// on the demo's GPT (at the 2 MiB chunks of spillway-train-demo's
// configuration) and on GPT-2 small and medium (at the default 64 MB), both
// as torch modules (params and grads) and as spillway-chunksize's GPT
// generator lays them out (params, grads, fp32 master, Adam's moments).
// The figure is the chunk manager's own statistic, and the search packs alike.
TEST(ChunkFillRatio, DefaultLayoutsFillTheirChunks) {
  struct Layout {
    const char* name;
    std::vector<chunksize::ModelTensor> tensors;
    std::size_t chunk_size;
  };
  const std::size_t kDefaultChunkSize = Config{}.chunk_size;
  ASSERT_EQ(kDefaultChunkSize, chunksize::kDefaultChunkSize);
  const std::vector<Layout> layouts{
      {"demo GPT", chunksize::gpt_module_tensors(chunksize::demo_gpt_shape()), 2 * MiB},
      {"GPT-2 small", chunksize::gpt_module_tensors(chunksize::gpt2_small_shape()),
       kDefaultChunkSize},
      {"GPT-2 medium", chunksize::gpt_module_tensors(chunksize::gpt2_medium_shape()),
       kDefaultChunkSize},
      {"GPT-2 small, generator",
       chunksize::model_tensors(sim::gpt_model({.n_layers = 12, .d_model = 768})),
       kDefaultChunkSize},
      {"GPT-2 medium, generator",
       chunksize::model_tensors(sim::gpt_model({.n_layers = 24, .d_model = 1024})),
       kDefaultChunkSize},
  };
  for (const Layout& layout : layouts) {
    SCOPED_TRACE(layout.name);
    ChunkRigOptions options;
    options.chunk_size = layout.chunk_size;
    ChunkRig rig(options);
    std::vector<TensorId> ids;
    register_all(*rig.chunks, layout.tensors, &ids);
    const ChunkStats stats = rig.chunks->stats();
    std::int64_t tensor_bytes = 0;
    for (const chunksize::ModelTensor& tensor : layout.tensors)
      tensor_bytes += static_cast<std::int64_t>(tensor.bytes);
    EXPECT_EQ(stats.tensor_bytes, tensor_bytes);
    EXPECT_GE(stats.fill_ratio(), 0.90);
    EXPECT_DOUBLE_EQ(stats.fill_ratio(),
                     chunksize::pack_tensors(layout.tensors, layout.chunk_size).fill_ratio());
  }
}

}  // namespace
}  // namespace spillway::testing
