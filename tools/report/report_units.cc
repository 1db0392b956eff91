#include "tools/report/report_units.h"

#include <fmt/format.h>

namespace spillway::report {

namespace {

constexpr const char* kByteUnits[] = {"KiB", "MiB", "GiB", "TiB"};

}  // namespace

std::string format_duration_ns(std::uint64_t ns) {
  if (ns < 1000) return fmt::format("{} ns", ns);
  const double value = static_cast<double>(ns);
  if (ns < 1000000) return fmt::format("{:.3f} us", value / 1e3);
  if (ns < 1000000000) return fmt::format("{:.3f} ms", value / 1e6);
  return fmt::format("{:.3f} s", value / 1e9);
}

std::string format_bytes_short(double bytes) {
  if (bytes < 1024) return fmt::format("{:g} B", bytes);
  double value = bytes / 1024;
  int unit = 0;
  while (value >= 1024 && unit + 1 < 4) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.3g} {}", value, kByteUnits[unit]);
}

std::string format_duration_short(double ns) {
  if (ns < 1e3) return fmt::format("{:.3g} ns", ns);
  if (ns < 1e6) return fmt::format("{:.3g} us", ns / 1e3);
  if (ns < 1e9) return fmt::format("{:.3g} ms", ns / 1e6);
  return fmt::format("{:.3g} s", ns / 1e9);
}

}  // namespace spillway::report
