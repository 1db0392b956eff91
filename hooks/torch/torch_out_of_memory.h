// torch's out-of-memory error for an allocation spillway could not satisfy.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/device/device.h"

namespace spillway::torch_bridge {

// Throws c10::OutOfMemoryError (Python: torch.OutOfMemoryError, which
// torch.cuda.OutOfMemoryError also catches) for a request of `bytes` that the
// process runtime's caching allocator refused with `status`, on this thread.
// The message names the request, the budget, allocated bytes (model chunks and
// the rest), reserved bytes, the largest free block, the chunks pinned by
// running ops (CachingAllocator::last_error()) and what to change.
[[noreturn]] void throw_out_of_memory(std::size_t bytes, Status status);

// Throws c10::OutOfMemoryError for a chunk the chunk manager could not place
// on the device (`what` failed: acquiring a gradient's chunk, placing a
// parameter), with its message (`detail`, ChunkManager::last_error()) and
// what to change; a caller that catches torch's out-of-memory error catches
// this one too.
[[noreturn]] void throw_chunk_out_of_memory(const std::string& what, const std::string& detail);

}  // namespace spillway::torch_bridge
