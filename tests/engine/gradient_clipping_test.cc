// The clipping factor per DeepSpeed path; exact parity with DeepSpeed's own
// code is deepspeed_scaler_parity_test.cc, these pin the behaviour without it.
#include <gtest/gtest.h>

#include "hooks/engine/gradient_clipping.h"

namespace spillway::engine {
namespace {

TEST(GradientClipping, EachPrecisionAndStageTakesItsDeepSpeedPath) {
  EXPECT_EQ(clip_path(Precision::f32, 0), ClipPath::fp32);
  EXPECT_EQ(clip_path(Precision::fp16, 0), ClipPath::fp16);
  EXPECT_EQ(clip_path(Precision::bf16, 0), ClipPath::bf16);
  for (Precision precision : {Precision::f32, Precision::fp16, Precision::bf16})
    for (int stage : {1, 2, 3}) EXPECT_EQ(clip_path(precision, stage), ClipPath::zero);
}

TEST(GradientClipping, ZeroDividesByScalarsAsCudaDoes) {
  // max_norm 0.3: CUDA multiplies by float(1 / 0.3f); a true division differs
  // in the last bit for this norm.
  const float norm = 0.9f;
  const float cuda_clip = (norm + static_cast<float>(1e-6)) * (1.0f / 0.3f);
  const float cpu_clip = (norm + static_cast<float>(1e-6)) / 0.3f;
  ASSERT_NE(cuda_clip, cpu_clip);  // the case tells the two apart
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::zero, norm, 0.3, 1), 1.0f / cuda_clip);
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::zero, 0.1, 1.0, 1), 1.0);
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::zero, 100.0, 0, 64), 1.0 / 64);
}

TEST(GradientClipping, NormsBelowTheMaximumAreNotClipped) {
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::fp32, 0.5, 1.0, 1), 1.0);
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::bf16, 0.5, 1.0, 1), 1.0);
  // fp16 still unscales: the factor is 1 / loss scale.
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::fp16, 0.5 * 1024, 1.0, 1024), 1.0 / 1024);
}

TEST(GradientClipping, TheEpsilonIsAddedToTheNorm) {
  // Exactly at max_norm, 1e-6 in the denominator clips a little.
  EXPECT_LT(deepspeed_gradient_factor(ClipPath::fp32, 1.0, 1.0, 1), 1.0);
  EXPECT_GT(deepspeed_gradient_factor(ClipPath::fp32, 1.0, 1.0, 1), 0.999998);
  EXPECT_FLOAT_EQ(deepspeed_gradient_factor(ClipPath::fp32, 4.0, 1.0, 1), 0.25f);
}

TEST(GradientClipping, Fp16CombinesUnscalingAndClipping) {
  // norm 4 after unscaling, max 1: the gradients shrink by 4 x the scale.
  EXPECT_FLOAT_EQ(deepspeed_gradient_factor(ClipPath::fp16, 4.0 * 256, 1.0, 256),
                  static_cast<float>(1.0 / (((4.0 + 1e-6) / 1.0) * 256)));
  // No clipping configured: only the unscaling.
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::fp16, 1e9, 0, 256), 1.0 / 256);
}

TEST(GradientClipping, NoMaximumMeansNoClipping) {
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::fp32, 1e9, 0, 1), 1.0);
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::bf16, 1e9, 0, 1), 1.0);
  EXPECT_EQ(deepspeed_gradient_factor(ClipPath::zero, 1e9, 0, 1), 1.0);
}

}  // namespace
}  // namespace spillway::engine
