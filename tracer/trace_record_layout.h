// Byte offsets of the fields of a 40-byte trace record (docs/trace-format.md,
// "Event records"), shared by the writer, the reader and its checkers.
#pragma once

#include <cstddef>

namespace spillway {

inline constexpr std::size_t kRecordTimeOffset = 0;
inline constexpr std::size_t kRecordKindOffset = 8;
// Reserved (zero) in version 1; detail and client since version 2.
inline constexpr std::size_t kRecordDetailOffset = 10;
inline constexpr std::size_t kRecordClientOffset = 12;
inline constexpr std::size_t kRecordStreamOffset = 16;
inline constexpr std::size_t kRecordAddressOffset = 24;
inline constexpr std::size_t kRecordSizeFieldOffset = 32;

}  // namespace spillway
