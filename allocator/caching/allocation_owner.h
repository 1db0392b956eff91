// AllocationOwner: whose bytes a block holds, model data or the rest; the
// caching allocator's statistics and out-of-memory accounting tell them apart.
#pragma once

#include <cstdint>

namespace spillway {

// Who a block is for: allocated_bytes.model or allocated_bytes.non_model.
enum class AllocationOwner : std::uint8_t {
  non_model,  // what a caller computes with: activations, temporaries
  // A chunk's device copy. Its requester, the chunk manager, evicts and tries
  // again when it fails, so a failure is not an out-of-memory (num_ooms, the
  // trace's oom events): only one that reaches a caller is.
  model,
};

}  // namespace spillway
