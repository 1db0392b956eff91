#include "allocator/chunk/inaccessible_mapping.h"

#include <sys/mman.h>
#include <unistd.h>

#include <utility>

namespace spillway {

InaccessibleMapping::InaccessibleMapping(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t size = ((bytes == 0 ? 1 : bytes) + page - 1) / page * page;
  void* data = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) return;
  data_ = data;
  bytes_ = size;
}

InaccessibleMapping::~InaccessibleMapping() { reset(); }

InaccessibleMapping::InaccessibleMapping(InaccessibleMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

InaccessibleMapping& InaccessibleMapping::operator=(InaccessibleMapping&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void InaccessibleMapping::reset() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace spillway
