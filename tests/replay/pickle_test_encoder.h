// A tiny pickle encoder for tests: protocol 2 opcodes for str, int, dict and
// list, so tests can build pickles byte by byte without Python.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace spillway::test_pickle {

inline std::string le(std::uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

inline std::string str(std::string_view text) {
  return "X" + le(text.size(), 4) + std::string(text);  // BINUNICODE
}

inline std::string integer(std::int64_t value) {
  return "\x8a\x08" + le(static_cast<std::uint64_t>(value), 8);  // LONG1, 8 bytes
}

// Keys and values alternate.
inline std::string dict(std::initializer_list<std::string> items) {
  std::string out = "}(";  // EMPTY_DICT MARK
  for (const std::string& item : items) out += item;
  return out + "u";  // SETITEMS
}

inline std::string list(std::initializer_list<std::string> items) {
  std::string out = "](";  // EMPTY_LIST MARK
  for (const std::string& item : items) out += item;
  return out + "e";  // APPENDS
}

// PROTO 2, the value, STOP.
inline std::string pickle(const std::string& value) { return "\x80\x02" + value + "."; }

}  // namespace spillway::test_pickle
