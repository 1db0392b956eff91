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
  std::map<std::pair<DataKind, std::uint32_t>, plan::PlanChunk> open;  // per (kind, slot)
  std::vector<std::uint64_t> used;  // per chunk: the end of its last tensor
  for (const ModelTensor& tensor : tensors) {
    const auto found = open.find(std::make_pair(tensor.kind, tensor.slot));
    ChunkPacker::OpenChunk open_chunk;
    if (found != open.end())
      open_chunk = {packing.chunks[found->second].capacity, used[found->second]};
    const ChunkPacker::Placement placement =
        packer.place(tensor.bytes, found != open.end() ? &open_chunk : nullptr);
    plan::PlanChunk chunk = found != open.end() ? found->second : 0;
    if (placement.where != ChunkPacker::Where::open_chunk) {
      const bool own = placement.where == ChunkPacker::Where::own_chunk;
      packing.chunks.push_back({tensor.kind, tensor.slot, placement.capacity, 0, own});
      used.push_back(0);
      chunk = static_cast<plan::PlanChunk>(packing.chunks.size() - 1);
      if (!own) open.insert_or_assign(std::make_pair(tensor.kind, tensor.slot), chunk);
    }
    used[chunk] = placement.offset + tensor.bytes;
    packing.chunks[chunk].tensor_bytes += tensor.bytes;
    packing.tensor_chunk.push_back(chunk);
    packing.tensor_offset.push_back(placement.offset);
  }
  return packing;
}

}  // namespace spillway::chunksize
