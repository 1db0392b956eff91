// The scheduler block of the configuration and LrSchedule: each of
// DeepSpeed's five schedulers on a few steps worked out by hand from its
// formula (lr_schedules.py), resuming from a saved last_batch_iteration, and
// every rejection naming its key. lr_schedule_parity_test.cc compares every
// step with DeepSpeed itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "hooks/engine/engine_config.h"
#include "hooks/engine/lr_schedule.h"

namespace spillway::engine {
namespace {

using testing::HasSubstr;

EngineConfig config_with(const std::string& optimizer, const std::string& scheduler) {
  return parse_engine_config(R"({"optimizer": )" + optimizer + R"(, "scheduler": )" + scheduler +
                             "}");
}

const char* kAdam = R"({"type": "Adam", "params": {"lr": 0.2, "betas": [0.7, 0.95]}})";
const char* kSgd = R"({"type": "SGD", "params": {"lr": 0.2, "momentum": 0.9}})";

// The schedule of `scheduler` over an Adam optimizer with lr 0.2.
LrSchedule schedule_of(const std::string& scheduler, const char* optimizer = kAdam) {
  const EngineConfig config = config_with(optimizer, scheduler);
  return LrSchedule(*config.scheduler, config.optimizer);
}

// lr() before each of the first `steps` optimizer steps.
std::vector<double> lrs(LrSchedule schedule, int steps) {
  std::vector<double> values;
  for (int i = 0; i < steps; ++i) {
    values.push_back(schedule.lr());
    schedule.step();
  }
  return values;
}

TEST(LrScheduleConfig, AbsentSchedulerIsNullopt) {
  EXPECT_FALSE(parse_engine_config(R"({"optimizer": {"type": "SGD"}})").scheduler.has_value());
}

TEST(LrScheduleConfig, DeepSpeedDefaults) {
  const LrScheduleConfig warmup =
      *config_with(kAdam, R"({"type": "WarmupLR", "params": {}})").scheduler;
  EXPECT_EQ(warmup.type, LrScheduleType::warmup_lr);
  EXPECT_EQ(warmup.warmup_min_lr, 0);
  EXPECT_FALSE(warmup.warmup_max_lr.has_value());  // the optimizer's lr
  EXPECT_EQ(warmup.warmup_num_steps, 1000);
  EXPECT_EQ(warmup.warmup_type, WarmupType::log);
  EXPECT_EQ(warmup.last_batch_iteration, -1);

  const LrScheduleConfig decay =
      *config_with(kAdam, R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}})")
           .scheduler;
  EXPECT_EQ(decay.warmup_max_lr, 0.001);  // WarmupDecayLR's own default
  EXPECT_EQ(decay.total_num_steps, 5000);
  const LrScheduleConfig decay_null = *config_with(kAdam, R"({"type": "WarmupDecayLR",
                               "params": {"total_num_steps": 5000, "warmup_max_lr": null}})")
                                           .scheduler;
  EXPECT_FALSE(decay_null.warmup_max_lr.has_value());

  const LrScheduleConfig cosine =
      *config_with(kAdam, R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 5000}})")
           .scheduler;
  EXPECT_EQ(cosine.warmup_min_ratio, 0);
  EXPECT_EQ(cosine.cos_min_ratio, 0.0001);
  EXPECT_EQ(cosine.warmup_num_steps, 1000);

  const LrScheduleConfig cycle = *config_with(kAdam, R"({"type": "OneCycle",
      "params": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_second_step_size": null}})")
                                      .scheduler;
  EXPECT_EQ(cycle.cycle_min_lr, 0.01);
  EXPECT_EQ(cycle.cycle_max_lr, 0.1);
  EXPECT_EQ(cycle.cycle_first_step_size, 2000);
  EXPECT_FALSE(cycle.cycle_second_step_size.has_value());
  EXPECT_EQ(cycle.decay_step_size, 0);
  EXPECT_TRUE(cycle.cycle_momentum);
  EXPECT_EQ(cycle.cycle_min_mom, 0.8);
  EXPECT_EQ(cycle.cycle_max_mom, 0.9);

  const LrScheduleConfig range =
      *config_with(kAdam, R"({"type": "LRRangeTest", "params": {}})").scheduler;
  EXPECT_EQ(range.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(range.lr_range_test_step_size, 2000);
  EXPECT_EQ(range.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(range.lr_range_test_staircase);
}

TEST(LrSchedule, WarmupLrLog) {
  // min 0 + 0.1 x log(it + 1) / log(4); the lr before the first step is
  // min (DeepSpeed's constructor sets it), and so is the second (it 0).
  const std::vector<double> lr = lrs(schedule_of(R"({"type": "WarmupLR", "params": {
      "warmup_max_lr": 0.1, "warmup_num_steps": 4}})"),
                                     7);
  EXPECT_EQ(lr[0], 0);
  EXPECT_EQ(lr[1], 0);
  EXPECT_DOUBLE_EQ(lr[2], 0.05);            // log 2 / log 4
  EXPECT_NEAR(lr[3], 0.0792481250, 1e-10);  // log 3 / log 4
  EXPECT_DOUBLE_EQ(lr[4], 0.1);             // log 4 / log 4
  EXPECT_EQ(lr[6], 0.1);                    // warmed up: the max
}

TEST(LrSchedule, WarmupLrLinearDefaultsToTheOptimizerLr) {
  // 0.05 + (0.2 - 0.05) x it / 5, 0.2 being the optimizer's lr.
  const std::vector<double> lr = lrs(schedule_of(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 0.05, "warmup_num_steps": 5, "warmup_type": "linear"}})"),
                                     9);
  EXPECT_EQ(lr[0], 0.05);
  EXPECT_EQ(lr[1], 0.05);
  EXPECT_DOUBLE_EQ(lr[2], 0.08);
  EXPECT_DOUBLE_EQ(lr[3], 0.11);
  EXPECT_EQ(lr[8], 0.2);
}

TEST(LrSchedule, WarmupDecayLrFallsToZeroAtTotalSteps) {
  // Warmup 0.1 x it / 4, then 0.1 x (8 - it) / (8 - 4), not below 0.
  const std::vector<double> lr = lrs(schedule_of(R"({"type": "WarmupDecayLR", "params": {
      "warmup_max_lr": 0.1, "warmup_num_steps": 4, "total_num_steps": 8,
      "warmup_type": "linear"}})"),
                                     13);
  EXPECT_DOUBLE_EQ(lr[2], 0.025);  // it 1
  EXPECT_DOUBLE_EQ(lr[4], 0.075);  // it 3
  EXPECT_DOUBLE_EQ(lr[5], 0.1);    // it 4: (8 - 4) / 4
  EXPECT_DOUBLE_EQ(lr[7], 0.05);   // it 6: 2 / 4
  EXPECT_EQ(lr[9], 0);             // it 8
  EXPECT_EQ(lr[12], 0);            // it 11: max(0, -3 / 4)
}

TEST(LrSchedule, WarmupCosineLrScalesTheOptimizerLr) {
  // lr 0.2 x ratio. Before the first step() DeepSpeed's lr is 0. Warmup
  // (linear over 2): 0.5 + (it / 2) x 0.5. Then (1 + cos(pi x (it - 1) / 4)) / 2,
  // which rises again past total_num_steps as DeepSpeed's does.
  const std::vector<double> lr = lrs(schedule_of(R"({"type": "WarmupCosineLR", "params": {
      "total_num_steps": 6, "warmup_num_steps": 2, "warmup_type": "linear",
      "warmup_min_ratio": 0.5, "cos_min_ratio": 0}})"),
                                     8);
  EXPECT_EQ(lr[0], 0);
  EXPECT_DOUBLE_EQ(lr[1], 0.1);                   // it 0: ratio 0.5
  EXPECT_DOUBLE_EQ(lr[2], 0.15);                  // it 1: 0.75
  EXPECT_NEAR(lr[3], 0.2 * 0.8535533906, 1e-10);  // it 2: cos(pi / 4)
  EXPECT_NEAR(lr[5], 0.2 * 0.1464466094, 1e-10);  // it 4: cos(3 pi / 4)
  EXPECT_NEAR(lr[6], 0, 1e-17);                   // it 5: cos(pi)
  EXPECT_NEAR(lr[7], 0.2 * 0.1464466094, 1e-10);  // it 6: cos(5 pi / 4)
}

TEST(LrSchedule, OneCycleCyclesLrAndAdamBeta1) {
  // Cycle of 4 + 4 steps; scale at it: x = (it + 1) / 8 mod 1, rising x / 0.5
  // to 1 at x = 0.5, then falling (x - 1) / (0.5 - 1). lr = 0.1 + 0.4 x scale,
  // beta1 = 0.9 - 0.1 x scale, beta2 DeepSpeed's 0.99. Then (no decay) 0.1
  // and beta1 0.9. The constructor sets beta1 to cycle_min_mom.
  LrSchedule schedule = schedule_of(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 0.5, "cycle_first_step_size": 4}})");
  ASSERT_TRUE(schedule.betas().has_value());
  EXPECT_EQ(schedule.lr(), 0.1);
  EXPECT_EQ(schedule.betas()->beta1, 0.8);
  EXPECT_EQ(schedule.betas()->beta2, 0.99);
  std::vector<double> lr, beta1;
  for (int i = 0; i < 10; ++i) {
    schedule.step();
    lr.push_back(schedule.lr());
    beta1.push_back(schedule.betas()->beta1);
  }
  EXPECT_DOUBLE_EQ(lr[0], 0.2);  // it 0: scale 0.25
  EXPECT_DOUBLE_EQ(beta1[0], 0.875);
  EXPECT_DOUBLE_EQ(lr[3], 0.5);  // it 3: the peak
  EXPECT_DOUBLE_EQ(beta1[3], 0.8);
  EXPECT_DOUBLE_EQ(lr[5], 0.3);  // it 5: scale 0.5
  EXPECT_DOUBLE_EQ(beta1[5], 0.85);
  EXPECT_DOUBLE_EQ(lr[7], 0.1);  // it 7: scale 0
  EXPECT_DOUBLE_EQ(lr[9], 0.1);  // after the cycle
  EXPECT_DOUBLE_EQ(beta1[9], 0.9);
  EXPECT_EQ(schedule.betas()->beta2, 0.99);
}

TEST(LrSchedule, OneCycleDecaysAfterTheCycle) {
  // After 8 steps: 0.1 / (1 + 1.0 x (it - 8 + 1) / 2).
  const std::vector<double> lr = lrs(schedule_of(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 0.5, "cycle_first_step_size": 4,
      "decay_step_size": 2, "decay_lr_rate": 1.0, "cycle_momentum": false}})"),
                                     11);
  EXPECT_DOUBLE_EQ(lr[9], 0.1 / 1.5);  // it 8
  EXPECT_DOUBLE_EQ(lr[10], 0.05);      // it 9
}

TEST(LrSchedule, OneCycleLeavesMomentumAloneWithoutBetas) {
  LrSchedule sgd = schedule_of(
      R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 0.5}})", kSgd);
  LrSchedule no_cycling = schedule_of(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 0.5, "cycle_momentum": false}})");
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(sgd.betas().has_value());
    EXPECT_FALSE(no_cycling.betas().has_value());
    sgd.step();
    no_cycling.step();
  }
}

TEST(LrSchedule, LrRangeTestContinuousAndStaircase) {
  // 0.01 x (1 + 1.0 x q), q = (it + 1) / 4, floored for the staircase.
  const std::vector<double> continuous = lrs(schedule_of(R"({"type": "LRRangeTest", "params": {
      "lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 4}})"),
                                             5);
  EXPECT_EQ(continuous[0], 0.01);
  EXPECT_DOUBLE_EQ(continuous[1], 0.0125);
  EXPECT_DOUBLE_EQ(continuous[2], 0.015);
  EXPECT_DOUBLE_EQ(continuous[4], 0.02);
  const std::vector<double> stairs = lrs(schedule_of(R"({"type": "LRRangeTest", "params": {
      "lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 4,
      "lr_range_test_staircase": true}})"),
                                         9);
  EXPECT_EQ(stairs[1], 0.01);         // it 0: floor(1 / 4)
  EXPECT_EQ(stairs[3], 0.01);         // it 2
  EXPECT_DOUBLE_EQ(stairs[4], 0.02);  // it 3: floor(4 / 4)
  EXPECT_DOUBLE_EQ(stairs[7], 0.02);  // it 6
  EXPECT_DOUBLE_EQ(stairs[8], 0.03);  // it 7
}

TEST(LrSchedule, LastBatchIterationCountsSteps) {
  LrSchedule schedule = schedule_of(R"({"type": "WarmupLR", "params": {}})");
  EXPECT_EQ(schedule.last_batch_iteration(), -1);
  for (int i = 0; i < 3; ++i) schedule.step();
  EXPECT_EQ(schedule.last_batch_iteration(), 2);
}

TEST(LrSchedule, ConfiguredStartLeavesTheOptimizerLrUntilTheFirstStep) {
  // DeepSpeed's constructor with last_batch_iteration 10 touches nothing;
  // step() then computes the cycle at it 11.
  LrSchedule schedule = schedule_of(R"({"type": "OneCycle", "params": {
      "cycle_min_lr": 0.1, "cycle_max_lr": 0.5, "last_batch_iteration": 10}})");
  EXPECT_EQ(schedule.lr(), 0.2);
  EXPECT_FALSE(schedule.betas().has_value());
  schedule.step();
  EXPECT_EQ(schedule.last_batch_iteration(), 11);
  EXPECT_TRUE(schedule.betas().has_value());
  EXPECT_NE(schedule.lr(), 0.2);
}

// Every type, with betas where they are scheduled: a schedule restored from
// a saved iteration continues exactly as the one that was saved.
TEST(LrSchedule, RestoreResumesIdentically) {
  for (const char* scheduler :
       {R"({"type": "WarmupLR", "params": {"warmup_num_steps": 50}})",
        R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 60, "warmup_num_steps": 20}})",
        R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 60, "warmup_num_steps": 20}})",
        R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 0.5,
               "cycle_first_step_size": 20, "decay_step_size": 3, "decay_lr_rate": 0.2,
               "decay_mom_rate": 0.001}})",
        R"({"type": "LRRangeTest", "params": {"lr_range_test_step_size": 7}})"}) {
    SCOPED_TRACE(scheduler);
    LrSchedule saved = schedule_of(scheduler);
    for (int i = 0; i < 37; ++i) saved.step();
    LrSchedule resumed = schedule_of(scheduler);
    resumed.restore(saved.last_batch_iteration());
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(resumed.last_batch_iteration(), saved.last_batch_iteration());
      ASSERT_EQ(resumed.lr(), saved.lr()) << "after " << i << " steps";
      ASSERT_EQ(resumed.betas().has_value(), saved.betas().has_value());
      if (saved.betas()) ASSERT_EQ(resumed.betas()->beta1, saved.betas()->beta1);
      saved.step();
      resumed.step();
    }
  }
}

TEST(LrSchedule, RestoreToTheStartGivesTheConstructorsValues) {
  const char* scheduler = R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1,
      "cycle_max_lr": 0.5, "cycle_first_step_size": 4}})";
  LrSchedule schedule = schedule_of(scheduler);
  for (int i = 0; i < 5; ++i) schedule.step();
  schedule.restore(-1);
  const LrSchedule fresh = schedule_of(scheduler);
  EXPECT_EQ(schedule.lr(), fresh.lr());
  EXPECT_EQ(schedule.betas()->beta1, fresh.betas()->beta1);
  EXPECT_EQ(schedule.last_batch_iteration(), -1);
}

TEST(LrSchedule, RestoreRejectsAnIterationBelowMinusOne) {
  LrSchedule schedule = schedule_of(R"({"type": "WarmupLR", "params": {}})");
  schedule.step();
  EXPECT_THROW(schedule.restore(-2), std::invalid_argument);
  EXPECT_EQ(schedule.last_batch_iteration(), 0);  // unchanged
}

// The message a scheduler block is rejected with, or "" when accepted.
std::string rejection(const std::string& scheduler) {
  try {
    config_with(kAdam, scheduler);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "";
}

TEST(LrScheduleConfig, RejectionsNameTheKeyAndWhatItAccepts) {
  struct Case {
    const char* scheduler;
    const char* message;
  };
  const Case cases[] = {
      {"3", "scheduler: expected an object"},
      {R"({"params": {}})", "scheduler.type: required"},
      {R"({"type": "warmuplr", "params": {}})",
       "scheduler.type: expected one of DeepSpeed's schedulers WarmupLR, WarmupDecayLR, "
       "WarmupCosineLR, OneCycle, LRRangeTest (exact names, case-sensitive"},
      {R"({"type": "StepLR", "params": {}})", "scheduler.type: expected one of"},
      {R"({"type": 5, "params": {}})", "scheduler.type: expected one of"},
      {R"({"type": "WarmupLR"})", "scheduler.params: required"},
      {R"({"type": "WarmupLR", "params": []})", "scheduler.params: expected an object"},
      {R"({"type": "WarmupLR", "params": {}, "warmup": 1})", "scheduler.warmup: unknown key"},
      {R"({"type": "WarmupLR", "params": {"total_num_steps": 10}})",
       "scheduler.params.total_num_steps: unknown key (accepted here: warmup_min_lr"},
      {R"({"type": "WarmupLR", "params": {"warmup_num_steps": "10"}})",
       "scheduler.params.warmup_num_steps: expected an integer >= 0"},
      {R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10.5}})",
       "scheduler.params.warmup_num_steps: expected an integer"},
      {R"({"type": "WarmupLR", "params": {"warmup_min_lr": -1}})",
       "scheduler.params.warmup_min_lr: expected a number >= 0"},
      {R"({"type": "WarmupLR", "params": {"warmup_max_lr": [0.1, 0.2]}})",
       "scheduler.params.warmup_max_lr: expected a number"},
      {R"({"type": "WarmupLR", "params": {"warmup_type": "cosine"}})",
       R"(scheduler.params.warmup_type: expected "log" or "linear")"},
      {R"({"type": "WarmupDecayLR", "params": {}})",
       "scheduler.params.total_num_steps: required by WarmupDecayLR"},
      {R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 5, "warmup_num_steps": 10}})",
       "scheduler.params.total_num_steps: expected an integer >= warmup_num_steps (10"},
      {R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 1, "warmup_num_steps": 0}})",
       "scheduler.params.total_num_steps: expected an integer >= warmup_num_steps (2"},
      {R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 10}})",
       "scheduler.params.total_num_steps: expected an integer > warmup_num_steps (10"},
      {R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_min_lr": 0}})",
       "scheduler.params.warmup_min_lr: unknown key"},
      {R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "cos_min_ratio": "x"}})",
       "scheduler.params.cos_min_ratio: expected a number"},
      {R"({"type": "OneCycle", "params": {"cycle_max_lr": 0.1}})",
       "scheduler.params.cycle_min_lr: required by OneCycle"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1}})",
       "scheduler.params.cycle_max_lr: required by OneCycle"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "cycle_first_step_size": 0}})",
       "scheduler.params.cycle_first_step_size: expected an integer >= 1"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "cycle_second_step_size": -1}})",
       "scheduler.params.cycle_second_step_size: expected an integer >= 0"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "cycle_momentum": "yes"}})",
       "scheduler.params.cycle_momentum: expected true or false"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "cycle_max_mom": 1.0}})",
       "scheduler.params.cycle_max_mom: expected a number in [0, 1)"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "cycle_min_mom": -0.1}})",
       "scheduler.params.cycle_min_mom: expected a number >= 0"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "decay_lr_rate": -0.5}})",
       "scheduler.params.decay_lr_rate: expected a number >= 0"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "decay_step_size": 1.5}})",
       "scheduler.params.decay_step_size: expected an integer >= 0"},
      {R"({"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
           "warmup_num_steps": 10}})",
       "scheduler.params.warmup_num_steps: unknown key"},
      {R"({"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}})",
       "scheduler.params.lr_range_test_step_size: expected an integer >= 1"},
      {R"({"type": "LRRangeTest", "params": {"lr_range_test_staircase": 1}})",
       "scheduler.params.lr_range_test_staircase: expected true or false"},
      {R"({"type": "LRRangeTest", "params": {"lr_range_test_step_rate": -1}})",
       "scheduler.params.lr_range_test_step_rate: expected a number >= 0"},
      {R"({"type": "LRRangeTest", "params": {"last_batch_iteration": -2}})",
       "scheduler.params.last_batch_iteration: expected an integer >= -1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheduler);
    EXPECT_THAT(rejection(c.scheduler), HasSubstr(std::string("engine config: ") + c.message));
  }
}

}  // namespace
}  // namespace spillway::engine
