#include "allocator/config/invariant.h"

#include <cstdio>
#include <cstdlib>

namespace spillway::detail {

void invariant_broken(const char* condition, std::string_view message, const char* file, int line) {
  std::fprintf(stderr, "spillway: invariant broken at %s:%d: %s (%.*s)\n", file, line, condition,
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  std::abort();
}

}  // namespace spillway::detail
