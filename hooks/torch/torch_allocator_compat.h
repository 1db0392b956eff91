// torch_allocator_compat.h: the one place where c10::Allocator differs between
// torch versions. spillway supports torch >= 2.4; the guard stays small so a
// change in a later torch lands here and nowhere else.
//
//  - allocate() is const up to torch 2.2, non-const from 2.3.
//  - copy_data() is a pure virtual from 2.3 (what Allocator::clone uses).
//
// A subclass of CompatAllocator implements do_allocate() and raw_deleter().
#pragma once

#include <cstddef>

#include <c10/core/Allocator.h>
#include <torch/version.h>

#define SPILLWAY_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !SPILLWAY_TORCH_AT_LEAST(2, 4)
#error "spillway's LibTorch bridge needs torch >= 2.4"
#endif

namespace spillway::torch_bridge {

class CompatAllocator : public c10::Allocator {
 public:
  // torch < 2.3 (no longer built): `c10::DataPtr allocate(std::size_t) const
  // final`, and no copy_data.
  c10::DataPtr allocate(std::size_t bytes) final { return do_allocate(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const final {
    default_copy_data(dest, src, count);
  }

 protected:
  virtual c10::DataPtr do_allocate(std::size_t bytes) const = 0;
};

}  // namespace spillway::torch_bridge
