// torch's own square root over a float array, for the CPU Adam kernels, so
// spillway's Adam matches torch's bit for bit whatever sqrt this torch build
// uses (Note [Square roots from torch] in hooks/optim/cpu_kernel_loops.inc).
#pragma once

#include <cstddef>

namespace spillway::optim {

// out[i] = at::sqrt(in[i]) for i < count, as torch computes it for a
// contiguous float tensor. Thread-safe.
void torch_sqrt(const float* in, float* out, std::size_t count);

}  // namespace spillway::optim
