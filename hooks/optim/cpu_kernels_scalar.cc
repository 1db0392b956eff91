// Scalar variant of the CPU optimizer kernels: the loops of
// cpu_kernel_loops.inc over one float at a time, for any CPU. It is also the
// reference the SIMD variants must match bit for bit (std::fma rounds once,
// like vfmadd; the build turns contraction off so nothing else is fused).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hooks/optim/cpu_kernel_internal.h"

namespace spillway::optim::cpu::scalar_isa {

struct Ops {
  using F = float;
  using D = double;
  static constexpr std::size_t kWidth = 1;

  static F load(const float* p) { return *p; }
  static F load(const detail::Bf16* p) { return detail::portable_bf16_to_float(p->bits); }
  static F load(const detail::F16* p) { return detail::portable_f16_to_float(p->bits); }
  static void store(float* p, F x) { *p = x; }
  static void store(detail::Bf16* p, F x) { p->bits = detail::portable_float_to_bf16(x); }
  static void store(detail::F16* p, F x) { p->bits = detail::portable_float_to_f16(x); }
  static void store(detail::NoLowParams*, F) {}

  static F set1(float x) { return x; }
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  static F div(F a, F b) { return a / b; }
  static F sqrt(F a) { return std::sqrt(a); }
  static F fma(F a, F b, F c) { return std::fma(a, b, c); }

  static D dzero() { return 0.0; }
  static D add_squares(D acc, F x) {
    const double wide = x;
    return acc + wide * wide;
  }
  static double reduce(D acc) { return acc; }
};

#include "hooks/optim/cpu_kernel_loops.inc"

}  // namespace spillway::optim::cpu::scalar_isa

namespace spillway::optim::cpu::detail {
const KernelTable& scalar_kernel_table() { return scalar_isa::kKernelTable; }
}  // namespace spillway::optim::cpu::detail
