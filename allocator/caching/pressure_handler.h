// PressureHandler: something that holds device memory through the caching
// allocator and can give some back when the allocator runs out of budget.
// The chunk manager is one: it spills model chunks to host memory.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "allocator/device/device.h"

namespace spillway {

class PressureHandler {
 public:
  virtual ~PressureHandler() = default;

  // Asked when an allocation of `bytes` on `stream` does not fit. Frees what it
  // can (through CachingAllocator::deallocate) and returns the bytes it freed.
  // Called without any allocator lock held, so it may free and allocate.
  virtual std::size_t relieve_pressure(std::size_t bytes, Stream stream) = 0;

  // Who this is and what it holds, for out-of-memory messages, e.g.
  // "chunk manager: 12 chunks, 768.0 MiB on device (3 in compute)".
  virtual std::string describe_holdings() const = 0;
};

}  // namespace spillway
