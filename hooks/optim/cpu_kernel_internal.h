// Internals shared by the CPU optimizer kernel variants (scalar, AVX2, AVX-512):
// the per-step scalars each step is reduced to (update_scalars.h), the table of one variant's
// range functions, and the portable bf16/fp16 conversions.
//
// Note [ISA-specific code and ODR]
// The AVX2 and AVX-512 files are compiled with -mavx2 / -mavx512f. An inline
// function or template instantiation they share with other files would be
// emitted there with those instructions, and the linker may keep that copy
// for every caller, which then faults on an older CPU. So everything an ISA
// file compiles lives in its own namespace (the .inc is included inside it),
// helpers here are `static inline` (one private copy per file), and the ISA
// files use no standard-library templates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hooks/optim/cpu_kernels.h"
#include "hooks/optim/update_scalars.h"

namespace spillway::optim::cpu::detail {

// One variant's kernels over the element range [begin, end) of whole arrays.
struct KernelTable {
  void (*adam)(const AdamArrays& arrays, const AdamScalars& scalars, std::size_t begin,
               std::size_t end);
  void (*sgd)(const SgdArrays& arrays, const SgdScalars& scalars, std::size_t begin,
              std::size_t end);
  double (*sum_squares)(const void* grads, DType dtype, std::size_t begin, std::size_t end);
  void (*to_float)(const void* source, DType dtype, float* destination, std::size_t begin,
                   std::size_t end);
  void (*from_float)(const float* source, void* destination, DType dtype, std::size_t begin,
                     std::size_t end);
};

const KernelTable& scalar_kernel_table();
const KernelTable& avx2_kernel_table();    // only call when isa_supported(Isa::avx2)
const KernelTable& avx512_kernel_table();  // only call when isa_supported(Isa::avx512)

// Element tags, so loops are typed on what an array holds.
struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};
struct NoLowParams {};  // no low-precision parameter copy to write

static inline std::uint32_t float_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
static inline float bits_float(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

static inline float portable_bf16_to_float(std::uint16_t bits) {
  return bits_float(std::uint32_t{bits} << 16);
}

// Round to nearest even on the upper 16 bits; NaN is kept and made quiet.
static inline std::uint16_t portable_float_to_bf16(float value) {
  const std::uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

// As F16C's vcvtph2ps: subnormals exact, NaN payload kept and made quiet.
static inline float portable_f16_to_float(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t{half & 0x8000u} << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1fu;
  const std::uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) {
    return bits_float(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  }
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // exact
    return sign ? -magnitude : magnitude;
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// As F16C's vcvtps2ph with round-to-nearest-even (after F. Giesen's
// float_to_half_fast3_rtne): overflow to inf, subnormals rounded, NaN quiet.
static inline std::uint16_t portable_float_to_f16(float value) {
  std::uint32_t bits = float_bits(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits >= (127u + 16u) << 23) {  // |value| >= 65536: inf, or NaN
    if (bits > 0x7f800000u) return sign | 0x7e00u | ((bits >> 13) & 0x3ffu);
    return sign | 0x7c00u;
  }
  if (bits < 113u << 23) {  // below 2^-14: an f16 subnormal or zero
    // Adding 0.5f leaves |value| rounded (nearest even) to a multiple of 2^-24
    // in the low mantissa bits.
    constexpr std::uint32_t kMagicBits = 126u << 23;
    const float shifted = bits_float(bits) + bits_float(kMagicBits);
    return sign | static_cast<std::uint16_t>(float_bits(shifted) - kMagicBits);
  }
  const std::uint32_t mantissa_odd = (bits >> 13) & 1u;
  bits += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
  return sign | static_cast<std::uint16_t>(bits >> 13);
}

}  // namespace spillway::optim::cpu::detail
