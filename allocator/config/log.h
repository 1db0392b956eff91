// Logging to stderr at the configured `log` level.
//
//   SPILLWAY_LOG(warn, "pinning {} bytes failed; using pageable memory", bytes);
//
// Messages below the level cost one relaxed atomic load; formatting is fmt's.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string_view>

#include "allocator/config/config.h"

namespace spillway {

namespace detail {
extern std::atomic<int> log_threshold;
void write_log_line(LogLevel level, std::string_view message);
}  // namespace detail

void set_log_level(LogLevel level);
LogLevel log_level();

inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= detail::log_threshold.load(std::memory_order_relaxed);
}

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_enabled(level)) return;
  detail::write_log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spillway

#define SPILLWAY_LOG(level, ...) ::spillway::log(::spillway::LogLevel::level, __VA_ARGS__)
