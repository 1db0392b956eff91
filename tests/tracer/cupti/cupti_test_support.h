// Shared by the CUPTI source tests.
#pragma once

#include <cstddef>
#include <string>

namespace spillway::cupti_testing {

// How many warnings the project's logger wrote into `log` (captured stderr).
inline int warnings_in(const std::string& log) {
  int count = 0;
  for (std::size_t at = log.find("spillway[warn]"); at != std::string::npos;
       at = log.find("spillway[warn]", at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace spillway::cupti_testing
