// The steps_per_print and wall_clock_breakdown lines in DeepSpeed 0.18's
// format (engine.py _report_progress and the timers' log), which Python
// formats with str() of lists, floats and tuples.
#include "hooks/engine/progress_report.h"

#include <gtest/gtest.h>

namespace spillway::engine {
namespace {

TEST(ProgressReport, StepLineListsEachGroupsLrAndBetasAsPythonPrintsThem) {
  GroupMomentum adam;
  adam.betas = {{0.9, 0.999}, {0.8, 0.99}};
  EXPECT_EQ(progress_line(10, 2, {0.001, 1e-05}, adam),
            "[Rank 0] step=10, skipped=2, lr=[0.001, 1e-05], mom=[(0.9, 0.999), (0.8, 0.99)]");
}

TEST(ProgressReport, SgdPrintsMomentumAndIntegralFloatsKeepTheirPoint) {
  GroupMomentum sgd;
  sgd.sgd = true;
  sgd.momentum = {0.0};
  EXPECT_EQ(progress_line(20, 0, {1.0}, sgd), "[Rank 0] step=20, skipped=0, lr=[1.0], mom=[0.0]");
}

TEST(ProgressReport, TimerLinesNameMicrostepOrWindowTimersWithTwoDecimals) {
  const StepTimes times{1.234, 5.5, 0.125};
  EXPECT_EQ(timers_line(times, /*micro=*/true),
            "[Rank 0] time (ms) | fwd_microstep: 1.23 | bwd_microstep: 5.50 | "
            "bwd_inner_microstep: 5.50 | bwd_allreduce_microstep: 0.00 | step_microstep: 0.12");
  EXPECT_EQ(timers_line(times, /*micro=*/false),
            "[Rank 0] time (ms) | fwd: 1.23 | bwd: 5.50 | bwd_inner: 5.50 | bwd_allreduce: 0.00 "
            "| step: 0.12");
}

}  // namespace
}  // namespace spillway::engine
