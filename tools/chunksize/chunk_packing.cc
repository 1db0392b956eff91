#include "tools/chunksize/chunk_packing.h"

#include <map>
#include <stdexcept>
#include <utility>

namespace spillway::chunksize {
namespace {

std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

std::uint64_t Packing::capacity_bytes() const {
  std::uint64_t bytes = 0;
  for (const PackedChunk& chunk : chunks) bytes += chunk.capacity;
  return bytes;
}

std::uint64_t Packing::tensor_bytes() const {
  std::uint64_t bytes = 0;
  for (const PackedChunk& chunk : chunks) bytes += chunk.tensor_bytes;
  return bytes;
}

std::size_t Packing::own_chunks() const {
  std::size_t count = 0;
  for (const PackedChunk& chunk : chunks) count += chunk.own ? 1 : 0;
  return count;
}

Packing pack_tensors(const std::vector<ModelTensor>& tensors, std::uint64_t chunk_size) {
  if (chunk_size == 0) throw std::invalid_argument("chunk size must be positive");
  Packing packing;
  packing.chunk_size = chunk_size;
  struct Open {
    plan::PlanChunk chunk;
    std::uint64_t used;  // offset past the last tensor, padding included
  };
  std::map<std::pair<DataKind, std::uint32_t>, Open> open;
  auto new_chunk = [&](const ModelTensor& tensor, std::uint64_t capacity, bool own) {
    packing.chunks.push_back({tensor.kind, tensor.slot, capacity, 0, own});
    return static_cast<plan::PlanChunk>(packing.chunks.size() - 1);
  };
  for (const ModelTensor& tensor : tensors) {
    plan::PlanChunk chunk = 0;
    if (tensor.bytes > chunk_size) {
      chunk = new_chunk(tensor, round_up(tensor.bytes, kChunkRoundBytes), true);
    } else {
      const auto key = std::make_pair(tensor.kind, tensor.slot);
      auto found = open.find(key);
      std::uint64_t offset =
          found == open.end() ? 0 : round_up(found->second.used, kTensorAlignment);
      if (found == open.end() ||
          offset + tensor.bytes > packing.chunks[found->second.chunk].capacity) {
        const plan::PlanChunk fresh =
            new_chunk(tensor, round_up(chunk_size, kChunkRoundBytes), false);
        found = open.insert_or_assign(key, Open{fresh, 0}).first;
        offset = 0;
      }
      chunk = found->second.chunk;
      found->second.used = offset + tensor.bytes;
    }
    packing.chunks[chunk].tensor_bytes += tensor.bytes;
    packing.tensor_chunk.push_back(chunk);
  }
  return packing;
}

}  // namespace spillway::chunksize
