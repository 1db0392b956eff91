// The chunk manager and spillway-chunksize pack tensors the same way, because
// both use ChunkPacker (allocator/chunk/chunk_packer.h): the same tensors,
// registered with a chunk manager and packed by pack_tensors, give the same
// chunks (order, kind, slot, capacity) and put each tensor in the same chunk
// at the same offset.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/allocator/chunk/chunk_test_support.h"
#include "tools/chunksize/chunk_packing.h"
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

TEST(ChunkPackingAgreement, TheChunkManagerAndTheChunkSizeSearchPackAlike) {
  for (std::size_t chunk_size : {std::size_t{4096}, std::size_t{65536}, MiB + 100}) {
    SCOPED_TRACE(::testing::Message() << "chunk_size " << chunk_size);
    const std::vector<chunksize::ModelTensor> tensors = random_tensors(chunk_size, chunk_size);
    ChunkRigOptions options;
    options.chunk_size = chunk_size;
    ChunkRig rig(options);
    const ClientId client = rig.chunks->add_client("model");
    std::vector<TensorId> ids;
    for (const chunksize::ModelTensor& tensor : tensors) {
      TensorSpec spec;
      spec.kind = tensor_kind(tensor.kind);
      spec.slot = tensor.slot;
      spec.dtype_bytes = 1;
      spec.element_count = tensor.bytes;
      spec.name = tensor.name;
      TensorId id{};
      ASSERT_EQ(rig.chunks->register_tensor(client, spec, &id), Status::ok)
          << ChunkManager::last_error();
      ids.push_back(id);
    }
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
  }
}

}  // namespace
}  // namespace spillway::testing
