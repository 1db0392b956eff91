// Logging to stderr at the configured `log` level (see log.h).
//
// The threshold is one relaxed atomic, constant-initialized so that code
// running during static initialization can log safely. Each message goes out
// as one line, "spillway[warn]: message\n", in a single write(2): lines from
// concurrent threads (or ranks sharing a pipe) never interleave mid-line.
#include "allocator/config/log.h"

#include <unistd.h>

#include <cerrno>
#include <iterator>

namespace spillway {

namespace detail {

std::atomic<int> log_threshold{static_cast<int>(LogLevel::warn)};

void write_log_line(LogLevel level, std::string_view message) {
  fmt::memory_buffer line;
  fmt::format_to(std::back_inserter(line), "spillway[{}]: {}\n", to_string(level), message);
  const char* data = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // stderr is gone; logging must not take the process down with it
    }
    data += written;
    left -= static_cast<std::size_t>(written);
  }
}

}  // namespace detail

void set_log_level(LogLevel level) {
  detail::log_threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel log_level() {
  return static_cast<LogLevel>(detail::log_threshold.load(std::memory_order_relaxed));
}

}  // namespace spillway
