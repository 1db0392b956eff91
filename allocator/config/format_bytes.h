// Byte counts for people: every message and report that names a size says it
// the same way.
#pragma once

#include <cstddef>
#include <string>

namespace spillway {

// "12.50 MiB" style; "300 bytes" below 1 KiB.
std::string format_bytes(std::size_t bytes);

}  // namespace spillway
