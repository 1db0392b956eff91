// InaccessibleMapping: a range of address space that faults on any access.
//
// Under strict_residency a tensor whose chunk is not on the device points
// into its chunk's inaccessible mapping instead of at a host copy, so a
// kernel or host read that missed its acquire crashes at once rather than
// reading stale or host bytes. The range is reserved PROT_NONE with
// MAP_NORESERVE: it costs address space only, never memory.
#pragma once

#include <cstddef>

namespace spillway {

class InaccessibleMapping {
 public:
  InaccessibleMapping() = default;
  // Reserves `bytes` (rounded up to pages); data() is null when mmap failed.
  explicit InaccessibleMapping(std::size_t bytes);
  ~InaccessibleMapping();

  InaccessibleMapping(InaccessibleMapping&& other) noexcept;
  InaccessibleMapping& operator=(InaccessibleMapping&& other) noexcept;
  InaccessibleMapping(const InaccessibleMapping&) = delete;
  InaccessibleMapping& operator=(const InaccessibleMapping&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void reset();

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace spillway
