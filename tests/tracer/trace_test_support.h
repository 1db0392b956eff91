// Helpers for trace-file tests: re-labelling encoded bytes as another format
// version (the public encoder writes only the current one).
#pragma once

#include <cstdint>
#include <string>

namespace spillway::testing {

// CRC-32 (IEEE, as zlib), written out here so the tests do not use the
// reader's own.
inline std::uint32_t test_crc32(const std::string& data) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xFFFFFFFFu;
}

// `bytes` (a whole trace) with format_version set to `version` and the
// header CRC re-sealed, so only what the version changes is wrong.
inline std::string with_format_version(std::string bytes, std::uint32_t version) {
  for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<char>((version >> (8 * i)) & 0xFF);
  const std::uint32_t header_size =
      std::uint32_t(std::uint8_t(bytes[12])) | std::uint32_t(std::uint8_t(bytes[13])) << 8 |
      std::uint32_t(std::uint8_t(bytes[14])) << 16 | std::uint32_t(std::uint8_t(bytes[15])) << 24;
  std::string header = bytes.substr(0, header_size);
  for (int i = 32; i < 36; ++i) header[i] = 0;
  const std::uint32_t crc = test_crc32(header);
  for (int i = 0; i < 4; ++i) bytes[32 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  return bytes;
}

}  // namespace spillway::testing
