// bf16 / fp16 conversions: the portable functions and every ISA variant's
// vector conversions against independent references (F16C instructions,
// GCC's _Float16, and exhaustive round trips), round to nearest even.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "hooks/optim/cpu_kernels.h"

namespace spillway::optim::cpu {
namespace {

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
float float_of(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool has_f16c() { return __builtin_cpu_supports("f16c"); }

// Hardware references (this file is built with -mf16c; only called when present).
float f16c_to_float(std::uint16_t half) { return _cvtsh_ss(half); }
std::uint16_t f16c_from_float(float value) {
  return static_cast<std::uint16_t>(_cvtss_sh(value, _MM_FROUND_TO_NEAREST_INT));
}

// Nearest even bf16, by comparing the dropped 16 bits with one half (sign and
// magnitude: one up in the bit pattern is one bf16 step away from zero, and a
// carry into the exponent is the correct next value, inf included).
std::uint16_t reference_bf16(float value) {
  const std::uint32_t bits = bits_of(value);
  const auto truncated = static_cast<std::uint16_t>(bits >> 16);
  const std::uint32_t dropped = bits & 0xffffu;
  if (dropped > 0x8000u || (dropped == 0x8000u && (truncated & 1u))) {
    return static_cast<std::uint16_t>(truncated + 1);
  }
  return truncated;
}

std::vector<float> interesting_floats() {
  std::vector<float> values = {
      0.0f,          -0.0f,    1.0f,           -1.0f,           65504.0f,
      65519.99f,     65520.0f, 65536.0f,       1e-8f,           5.96e-8f,
      2.98e-8f,      2.99e-8f, 6.1e-5f,        6.09e-5f,        1e30f,
      -1e30f,        3.4e38f,  1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
      1.0f + 0x1p-9f};
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(std::numeric_limits<float>::denorm_min());
  values.push_back(std::numeric_limits<float>::min());
  values.push_back(std::numeric_limits<float>::max());
  // A sweep over all exponents and many mantissas (every 4099th bit pattern).
  for (std::uint64_t bits = 0; bits < (std::uint64_t{1} << 32); bits += 4099) {
    const float value = float_of(static_cast<std::uint32_t>(bits));
    if (!std::isnan(value)) values.push_back(value);
  }
  return values;
}

TEST(Bf16Conversion, RoundTripsEveryBf16Value) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float value = bf16_to_float(static_cast<std::uint16_t>(bits));
    ASSERT_EQ(bits_of(value), bits << 16);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(value))));
    } else {
      ASSERT_EQ(float_to_bf16(value), bits) << "bits " << bits;
    }
  }
}

TEST(Bf16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);                     // tie, even stays
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);                 // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-9f), 0x3f80);                     // below half
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A signalling NaN whose payload sits in the dropped bits stays NaN.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(float_of(0x7f800001u)))));
  for (float value : interesting_floats()) {
    ASSERT_EQ(float_to_bf16(value), reference_bf16(value)) << value;
  }
}

TEST(F16Conversion, EveryF16ValueMatchesHardwareAndRoundTrips) {
  if (!has_f16c()) GTEST_SKIP() << "this CPU has no F16C to compare with";
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = f16_to_float(half);
    ASSERT_EQ(bits_of(value), bits_of(f16c_to_float(half))) << "bits " << bits;
    if (!std::isnan(value)) {
      ASSERT_EQ(float_to_f16(value), half) << "bits " << bits;
    }
  }
}

TEST(F16Conversion, RoundsAsHardwareAndFloat16) {
  for (float value : interesting_floats()) {
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
    ASSERT_EQ(float_to_f16(value), expected) << value;
    if (has_f16c()) {
      ASSERT_EQ(float_to_f16(value), f16c_from_float(value)) << value;
    }
  }
  if (has_f16c()) {
    for (std::uint32_t nan_bits : {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa00000u}) {
      EXPECT_EQ(float_to_f16(float_of(nan_bits)), f16c_from_float(float_of(nan_bits)));
    }
  }
}

// Every ISA's array conversions equal the portable scalar functions.
class ArrayConversion : public ::testing::TestWithParam<Isa> {};

TEST_P(ArrayConversion, MatchesPortableFunctionsWithTails) {
  if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": not on this CPU";
  std::vector<float> values = interesting_floats();
  values.resize(200003);  // odd length: tails
  values.push_back(std::nanf(""));
  const ExecConfig exec{GetParam(), 2};
  for (DType dtype : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> low(values.size() + 1);
    convert_from_float(values.data(), low.data() + 1, dtype, values.size(), exec);  // unaligned
    for (std::size_t i = 0; i < values.size(); ++i) {
      const std::uint16_t expected =
          dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
      ASSERT_EQ(low[i + 1], expected) << dtype_name(dtype) << " at " << i;
    }
    std::vector<float> back(values.size());
    convert_to_float(low.data() + 1, dtype, back.data(), values.size(), exec);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float expected =
          dtype == DType::bf16 ? bf16_to_float(low[i + 1]) : f16_to_float(low[i + 1]);
      ASSERT_EQ(bits_of(back[i]), bits_of(expected)) << dtype_name(dtype) << " at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, ArrayConversion,
                         ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

}  // namespace
}  // namespace spillway::optim::cpu
