// The loss scaler follows DeepSpeed's update rule: halve after `hysteresis`
// overflows, double after `window` clean steps, never below the minimum.
#include <gtest/gtest.h>

#include "hooks/engine/loss_scaler.h"

namespace spillway::engine {
namespace {

LossScalerOptions dynamic_options(int power, int window, int hysteresis, double min_scale = 1) {
  LossScalerOptions options;
  options.initial_scale_power = power;
  options.window = window;
  options.hysteresis = hysteresis;
  options.min_scale = min_scale;
  return options;
}

TEST(LossScaler, StartsAtTwoToTheInitialPower) {
  EXPECT_EQ(LossScaler(dynamic_options(16, 1000, 2)).scale(), 65536.0);
  EXPECT_EQ(LossScaler(dynamic_options(0, 1000, 2)).scale(), 1.0);
}

TEST(LossScaler, DoublesAfterAWindowOfCleanSteps) {
  LossScaler scaler(dynamic_options(4, 3, 1));
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32.0);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 64.0);
  EXPECT_EQ(scaler.overflows(), 0u);
}

TEST(LossScaler, HalvesOnOverflowWithoutHysteresis) {
  LossScaler scaler(dynamic_options(4, 100, 1));
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 4.0);
  EXPECT_EQ(scaler.overflows(), 2u);
}

TEST(LossScaler, HysteresisAbsorbsOverflowsUntilTheScaleGrowsAgain) {
  LossScaler scaler(dynamic_options(4, 2, 3));
  scaler.update(true);  // absorbed (2 left)
  scaler.update(true);  // absorbed (1 left)
  EXPECT_EQ(scaler.scale(), 16.0);
  scaler.update(false);  // a clean step does not refill it
  scaler.update(true);   // halves
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);  // still at 1 left: halves again
  EXPECT_EQ(scaler.scale(), 4.0);
  scaler.update(false);
  scaler.update(false);  // a window after the last overflow: grows, refills
  EXPECT_EQ(scaler.scale(), 8.0);
  scaler.update(true);  // absorbed again
  EXPECT_EQ(scaler.scale(), 8.0);
}

TEST(LossScaler, NeverGoesBelowTheMinimum) {
  LossScaler scaler(dynamic_options(2, 100, 1, /*min_scale=*/2));
  for (int i = 0; i < 5; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 2.0);
}

TEST(LossScaler, StaticScaleNeverChangesButCountsOverflows) {
  LossScalerOptions options;
  options.static_scale = 128;
  LossScaler scaler(options);
  EXPECT_FALSE(scaler.dynamic());
  scaler.update(true);
  for (int i = 0; i < 2000; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 128.0);
  EXPECT_EQ(scaler.overflows(), 1u);
}

}  // namespace
}  // namespace spillway::engine
