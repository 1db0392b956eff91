// The loss scaler follows DeepSpeed 0.18's two rules: FP16_Optimizer's
// (fp16 without ZeRO: halve on every overflow) and DynamicLossScaler's (ZeRO:
// hysteresis, consecutive_hysteresis, stop at the minimum). Both double after
// `window` clean steps counted from the last overflow as DeepSpeed counts
// them. deepspeed_scaler_parity_test.cc compares with DeepSpeed itself.
#include <gtest/gtest.h>

#include <stdexcept>

#include "hooks/engine/loss_scaler.h"

namespace spillway::engine {
namespace {

LossScalerOptions dynamic_options(LossScaleRule rule, int power, int window, int hysteresis,
                                  double min_scale = 1) {
  LossScalerOptions options;
  options.rule = rule;
  options.initial_scale_power = power;
  options.window = window;
  options.hysteresis = hysteresis;
  options.min_scale = min_scale;
  return options;
}

constexpr LossScaleRule kStage0 = LossScaleRule::fp16_optimizer;
constexpr LossScaleRule kZero = LossScaleRule::zero_optimizer;

TEST(LossScaler, StartsAtTwoToTheInitialPower) {
  EXPECT_EQ(LossScaler(dynamic_options(kStage0, 16, 1000, 2)).scale(), 65536.0);
  EXPECT_EQ(LossScaler(dynamic_options(kZero, 0, 1000, 2)).scale(), 1.0);
}

TEST(LossScaler, FirstDoublingComesAfterWindowPlusOneCleanSteps) {
  for (LossScaleRule rule : {kStage0, kZero}) {
    LossScaler scaler(dynamic_options(rule, 4, 3, 1));
    for (int i = 0; i < 3; ++i) scaler.update(false);
    EXPECT_EQ(scaler.scale(), 16.0);  // DeepSpeed counts from iteration -1
    scaler.update(false);
    EXPECT_EQ(scaler.scale(), 32.0);
    for (int i = 0; i < 3; ++i) scaler.update(false);
    EXPECT_EQ(scaler.scale(), 64.0);
    EXPECT_EQ(scaler.overflows(), 0u);
  }
}

TEST(LossScaler, WithoutZeroEveryOverflowHalvesWhateverTheHysteresis) {
  LossScaler scaler(dynamic_options(kStage0, 4, 100, 5));
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4.0);
  EXPECT_EQ(scaler.overflows(), 2u);
}

TEST(LossScaler, WithoutZeroTheScaleStaysAtTheMinimum) {
  LossScaler scaler(dynamic_options(kStage0, 2, 100, 1, /*min_scale=*/2));
  for (int i = 0; i < 5; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2.0);
  EXPECT_EQ(scaler.overflows(), 5u);
}

TEST(LossScaler, UnderZeroHysteresisAbsorbsOverflowsUntilTheScaleGrowsAgain) {
  LossScaler scaler(dynamic_options(kZero, 4, 2, 3));
  scaler.update(true);  // absorbed (2 left)
  scaler.update(true);  // absorbed (1 left)
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false);  // a clean step does not refill it
  scaler.update(true);   // halves
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);  // still at 1 left: halves again
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.update(false);  // two clean steps after the last overflow: grows, refills
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);  // absorbed again
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(LossScaler, ConsecutiveHysteresisRefillsAfterEveryCleanStep) {
  LossScalerOptions options = dynamic_options(kZero, 4, 100, 2);
  options.consecutive_hysteresis = true;
  LossScaler scaler(options);
  for (int i = 0; i < 4; ++i) {
    scaler.update(true);  // absorbed every time: the clean step refilled it
    scaler.update(false);
  }
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(true);
  scaler.update(true);  // two in a row: halves
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(LossScaler, UnderZeroAnOverflowAtTheMinimumStopsTheRun) {
  LossScaler scaler(dynamic_options(kZero, 2, 100, 1, /*min_scale=*/2));
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2.0);
  EXPECT_THROW(scaler.update(true), std::runtime_error);
}

TEST(LossScaler, StaticScaleNeverChangesButCountsOverflows) {
  for (LossScaleRule rule : {kStage0, kZero}) {
    LossScalerOptions options;
    options.rule = rule;
    options.static_scale = 128;
    options.hysteresis = 1;
    LossScaler scaler(options);
    EXPECT_FALSE(scaler.dynamic());
    scaler.update(true);
    scaler.update(true);
    for (int i = 0; i < 2000; ++i) scaler.update(false);
    EXPECT_EQ(scaler.scale(), 128.0);
    EXPECT_EQ(scaler.overflows(), 2u);
  }
}

}  // namespace
}  // namespace spillway::engine
