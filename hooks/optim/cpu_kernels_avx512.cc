// AVX-512 variant of the CPU optimizer kernels: 16 floats per vector.
// Compiled alone with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c
// (hooks/optim/CMakeLists.txt) and only called when the CPU has them
// (Note [ISA-specific code and ODR]).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hooks/optim/cpu_kernel_internal.h"

namespace spillway::optim::cpu::avx512_isa {

struct Ops {
  using F = __m512;
  struct D {
    __m512d low, high;
  };
  static constexpr std::size_t kWidth = 16;

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const detail::Bf16* p) {
    const __m512i widened =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
  }
  static F load(const detail::F16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void store(detail::Bf16* p, F x) {
    // bits + 0x7fff + lsb(upper half), then the upper half; NaN -> upper | quiet bit.
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i halves = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(halves));
  }
  static void store(detail::F16* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(detail::NoLowParams*, F) {}

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }

  static D dzero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  static D add_squares(D acc, F x) {
    const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d high =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    return {_mm512_fmadd_pd(low, low, acc.low), _mm512_fmadd_pd(high, high, acc.high)};
  }
  static double reduce(D acc) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, _mm512_add_pd(acc.low, acc.high));
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
           ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  }
};

#include "hooks/optim/cpu_kernel_loops.inc"

}  // namespace spillway::optim::cpu::avx512_isa

namespace spillway::optim::cpu::detail {
const KernelTable& avx512_kernel_table() { return avx512_isa::kKernelTable; }
}  // namespace spillway::optim::cpu::detail
