// How the report writes bytes, durations and ratios: one place, so the text
// summary, the HTML page and the chart axes agree.
#pragma once

#include <cstdint>
#include <string>

#include "allocator/config/format_bytes.h"

namespace spillway::report {

// "12.50 MiB" style; "300 bytes" below 1 KiB: the allocator's own, so the
// report and spillway's messages write sizes alike.
using spillway::format_bytes;
// "1.234 ms" style: ns below 1 us, then us, ms, s.
std::string format_duration_ns(std::uint64_t ns);
// Short axis labels: "12 MiB", "1.5 GiB", "250 ms".
std::string format_bytes_short(double bytes);
std::string format_duration_short(double ns);

}  // namespace spillway::report
