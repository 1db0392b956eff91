#include "tools/chunksize/chunk_packing.h"

#include <map>
#include <stdexcept>
#include <utility>

#include "allocator/chunk/chunk_packer.h"

namespace spillway::chunksize {

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

double Packing::fill_ratio() const {
  const std::uint64_t capacity = capacity_bytes();
  return capacity == 0 ? 0.0 : static_cast<double>(tensor_bytes()) / static_cast<double>(capacity);
}

std::size_t Packing::own_chunks() const {
  std::size_t count = 0;
  for (const PackedChunk& chunk : chunks) count += chunk.own ? 1 : 0;
  return count;
}

Packing pack_tensors(const std::vector<ModelTensor>& tensors, std::uint64_t chunk_size) {
  if (chunk_size == 0) throw std::invalid_argument("chunk size must be positive");
  const ChunkPacker packer(chunk_size);
  Packing packing;
  packing.chunk_size = chunk_size;
  // Per (kind, slot): its open chunks, oldest first (Note [Packing tensors]).
  std::map<std::pair<DataKind, std::uint32_t>, std::vector<plan::PlanChunk>> open;
  std::vector<std::uint64_t> used;  // per chunk: the end of its last tensor
  std::vector<ChunkPacker::OpenChunk> open_view;
  for (const ModelTensor& tensor : tensors) {
    std::vector<plan::PlanChunk>& group = open[std::make_pair(tensor.kind, tensor.slot)];
    open_view.clear();
    for (plan::PlanChunk chunk : group) open_view.push_back({used[chunk]});
    const ChunkPacker::Placement placement = packer.place(tensor.bytes, open_view);
    plan::PlanChunk chunk = 0;
    if (placement.where == ChunkPacker::Where::open_chunk) {
      chunk = group[placement.open_index];
    } else {
      const bool own = placement.where == ChunkPacker::Where::own_chunk;
      packing.chunks.push_back({tensor.kind, tensor.slot, 0, 0, own});
      used.push_back(0);
      chunk = static_cast<plan::PlanChunk>(packing.chunks.size() - 1);
      if (!own) group.push_back(chunk);
    }
    used[chunk] = placement.offset + tensor.bytes;
    packing.chunks[chunk].capacity = placement.capacity;
    packing.chunks[chunk].tensor_bytes += tensor.bytes;
    packing.tensor_chunk.push_back(chunk);
    packing.tensor_offset.push_back(placement.offset);
  }
  return packing;
}

}  // namespace spillway::chunksize
