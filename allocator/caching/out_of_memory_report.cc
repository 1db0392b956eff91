#include "allocator/caching/out_of_memory_report.h"

#include <fmt/format.h>

#include "allocator/config/format_bytes.h"

namespace spillway {

std::string OutOfMemoryReport::message() const {
  const std::string stream_text =
      stream == 0 ? std::string("the default stream") : fmt::format("stream {:#x}", stream);
  std::string text = fmt::format(
      "out of memory: asked {} ({} bytes, {} rounded) on {}; budget {}, reserved {}, allocated "
      "{}, cached {} (reserved - allocated",
      format_bytes(asked_bytes), asked_bytes, rounded_bytes, stream_text,
      format_bytes(budget_bytes), format_bytes(reserved_bytes), format_bytes(allocated_bytes),
      format_bytes(reserved_bytes - allocated_bytes));
  if (awaiting_streams_bytes != 0) {
    text += fmt::format(", of which {} freed but still in use on other streams",
                        format_bytes(awaiting_streams_bytes));
  }
  text += fmt::format("), largest free block {}", format_bytes(largest_free_block_bytes));
  if (!reason.empty()) text += fmt::format("; {}", reason);
  if (pressure_handler_holdings.empty()) {
    text += "; no pressure handlers registered";
  } else {
    text += "; pressure handlers hold:";
    for (std::size_t i = 0; i < pressure_handler_holdings.size(); ++i) {
      text += fmt::format(" [{}] {}", i + 1, pressure_handler_holdings[i]);
    }
  }
  return text;
}

}  // namespace spillway
