// OutOfMemoryReport: what the caching allocator knew when it gave up on a
// request, written as the one message a user reads to find out who holds
// the memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spillway {

struct OutOfMemoryReport {
  std::size_t asked_bytes = 0;
  std::size_t rounded_bytes = 0;
  std::uintptr_t stream = 0;  // 0: the default stream
  std::size_t budget_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t allocated_bytes = 0;
  std::size_t awaiting_streams_bytes = 0;  // freed, waiting on other streams' events
  std::size_t largest_free_block_bytes = 0;
  std::string reason;                                  // why the last attempt failed, one clause
  std::vector<std::string> pressure_handler_holdings;  // describe_holdings(), in order

  std::string message() const;
};

}  // namespace spillway
