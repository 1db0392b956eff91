// Note [Virtual memory pages]
// cudaMalloc gives a segment a fixed size for life. With virtual memory
// (CUDA's cuMemAddressReserve/cuMemCreate/cuMemMap, the mechanism of
// PyTorch's expandable segments) an allocator reserves a large address range
// once and maps physical pages into it as it needs them, so a segment grows
// in place and gives back its free pages without moving a byte. The device
// counts mapped pages, not reserved address space, so the budget and
// memory_info see what is really held. Unlike cudaFree, unmapping waits for
// no queued work (nor does cuMemUnmap): the caller first waits for what may
// still touch the pages (the caching allocator: the segment's stream, or a
// chunk slab's fence, Note [Fenced slabs] in caching_allocator.cc).
// Backends without it (page_bytes() == 0) answer unavailable, and callers
// fall back to malloc.
#include "allocator/device/device.h"

namespace spillway {

Status Device::do_reserve_address_range(void** /*base*/, std::size_t /*bytes*/) {
  return Status::unavailable;
}
Status Device::do_release_address_range(void* /*base*/, std::size_t /*bytes*/) {
  return Status::unavailable;
}
Status Device::do_map_pages(void* /*address*/, std::size_t /*bytes*/) {
  return Status::unavailable;
}
Status Device::do_unmap_pages(void* /*address*/, std::size_t /*bytes*/) {
  return Status::unavailable;
}

std::string_view to_string(Status status) {
  switch (status) {
    case Status::ok:
      return "ok";
    case Status::not_ready:
      return "not ready";
    case Status::out_of_memory:
      return "out of memory";
    case Status::invalid_argument:
      return "invalid argument";
    case Status::unavailable:
      return "unavailable";
    case Status::injected_fault:
      return "injected fault";
    case Status::error:
      return "error";
  }
  return "unknown status";
}

std::string_view to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cuda:
      return "cuda";
    case DeviceKind::sim:
      return "sim";
  }
  return "unknown device";
}

}  // namespace spillway
