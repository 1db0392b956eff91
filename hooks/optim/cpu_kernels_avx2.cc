// AVX2 variant of the CPU optimizer kernels: 8 floats per vector, FMA for
// torch's add-with-alpha, F16C for fp16 and integer rounding for bf16.
// Compiled alone with -mavx2 -mfma -mf16c (hooks/optim/CMakeLists.txt) and
// only called when the CPU has them (Note [ISA-specific code and ODR]).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hooks/optim/cpu_kernel_internal.h"

namespace spillway::optim::cpu::avx2_isa {

struct Ops {
  using F = __m256;
  struct D {
    __m256d low, high;
  };
  static constexpr std::size_t kWidth = 8;

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const detail::Bf16* p) {
    const __m256i widened =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
  }
  static F load(const detail::F16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void store(detail::Bf16* p, F x) {
    // bits + 0x7fff + lsb(upper half), then the upper half; NaN -> upper | quiet bit.
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i halves = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet_nan), is_nan));
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(halves), _mm256_extracti128_si256(halves, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store(detail::F16* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store(detail::NoLowParams*, F) {}

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  static D dzero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static D add_squares(D acc, F x) {
    const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    return {_mm256_fmadd_pd(low, low, acc.low), _mm256_fmadd_pd(high, high, acc.high)};
  }
  static double reduce(D acc) {
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(acc.low, acc.high));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  }
};

#include "hooks/optim/cpu_kernel_loops.inc"

}  // namespace spillway::optim::cpu::avx2_isa

namespace spillway::optim::cpu::detail {
const KernelTable& avx2_kernel_table() { return avx2_isa::kKernelTable; }
}  // namespace spillway::optim::cpu::detail
