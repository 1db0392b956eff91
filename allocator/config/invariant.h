// SPILLWAY_INVARIANT(condition, message): checks an invariant that a Note
// states, in the builds that check them (as mimalloc's mi_assert_internal and
// PyTorch's TORCH_INTERNAL_ASSERT_DEBUG_ONLY).
//
// - On where SPILLWAY_CHECK_INVARIANTS is 1: the sanitizer builds and Debug
//   builds (the CMake option of that name). A broken invariant is a bug in
//   spillway, not a user's error: it prints the condition, the message and
//   where, and aborts.
// - Elsewhere the condition is compiled but never evaluated, and costs
//   nothing: release builds keep their hot paths (Note [A short hot path]).
// - Not for checking input: a bad call is a Status with a message.
#pragma once

#include <string_view>

namespace spillway::detail {
[[noreturn]] void invariant_broken(const char* condition, std::string_view message,
                                   const char* file, int line);
}  // namespace spillway::detail

#if SPILLWAY_CHECK_INVARIANTS
#define SPILLWAY_INVARIANT(condition, message) \
  ((condition) ? static_cast<void>(0)          \
               : ::spillway::detail::invariant_broken(#condition, (message), __FILE__, __LINE__))
#else
#define SPILLWAY_INVARIANT(condition, message) static_cast<void>(sizeof((condition) ? 1 : 0))
#endif
