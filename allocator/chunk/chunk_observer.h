// ChunkObserver: told where tensors went whenever their chunk moves, so that
// whoever binds tensors to chunk memory (the torch bridge rebinds storage
// data pointers) can follow.
#pragma once

#include <span>

#include "allocator/chunk/chunk_types.h"

namespace spillway {

struct TensorAddress {
  TensorId tensor{};
  ClientId client{};
  // As TensorInfo::address: device memory, the host copy, an inaccessible
  // address (strict_residency), or null.
  void* address = nullptr;
  Location location = Location::none;
};

class ChunkObserver {
 public:
  virtual ~ChunkObserver() = default;

  // Every tensor of one chunk, after the chunk moved (fetched, evicted,
  // discarded, re-laid, removed). Called with the chunk manager's lock held,
  // in move order, on the thread that caused the move: it must be quick and
  // must not call back into the chunk manager.
  virtual void on_tensors_moved(std::span<const TensorAddress> tensors) = 0;
};

}  // namespace spillway
