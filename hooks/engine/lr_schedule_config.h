// LrScheduleConfig: the `scheduler` block of a DeepSpeed configuration,
// {"type": T, "params": {...}}, for DeepSpeed's five schedulers
// (deepspeed/runtime/lr_schedules.py), with their parameter names, defaults
// and meanings. read_lr_schedule.h reads it from JSON; LrSchedule
// (lr_schedule.h) computes the learning rate from it.
#pragma once

#include <optional>

namespace spillway::engine {

enum class LrScheduleType {
  warmup_lr,
  warmup_decay_lr,
  warmup_cosine_lr,
  one_cycle,
  lr_range_test
};

// How the warmup rises from its start to its end over warmup_num_steps.
enum class WarmupType { log, linear };

// One field per DeepSpeed parameter; each type reads only its own.
struct LrScheduleConfig {
  LrScheduleType type = LrScheduleType::warmup_lr;
  // DeepSpeed's resume argument: -1 starts the schedule (and sets the
  // optimizer's lr at construction); any other value leaves the optimizer's
  // lr alone until the first step.
  long long last_batch_iteration = -1;

  // WarmupLR, WarmupDecayLR: lr from warmup_min_lr to warmup_max_lr over
  // warmup_num_steps (at least 2 in effect), then constant (WarmupLR) or
  // falling linearly to 0 at total_num_steps (WarmupDecayLR).
  double warmup_min_lr = 0;
  // nullopt: the optimizer's lr (WarmupLR's default, or null in the JSON);
  // WarmupDecayLR's default is 0.001.
  std::optional<double> warmup_max_lr;
  long long warmup_num_steps = 1000;         // WarmupCosineLR too
  WarmupType warmup_type = WarmupType::log;  // WarmupCosineLR too
  long long total_num_steps = 0;             // WarmupDecayLR, WarmupCosineLR: required

  // WarmupCosineLR: the optimizer's lr times a ratio that rises from
  // warmup_min_ratio to 1 over the warmup, then follows a cosine down to
  // cos_min_ratio at total_num_steps.
  double warmup_min_ratio = 0;
  double cos_min_ratio = 0.0001;

  // OneCycle: lr from cycle_min_lr up to cycle_max_lr over
  // cycle_first_step_size steps and back over cycle_second_step_size, then
  // cycle_min_lr / (1 + decay_lr_rate x steps_after / decay_step_size).
  // With cycle_momentum, Adam's beta1 moves the opposite way between
  // cycle_max_mom and cycle_min_mom (SGD's momentum is never touched).
  double cycle_min_lr = 0;  // required
  double cycle_max_lr = 0;  // required
  double decay_lr_rate = 0;
  long long cycle_first_step_size = 2000;
  std::optional<long long> cycle_second_step_size;  // nullopt: cycle_first_step_size
  // Accepted as DeepSpeed accepts them; its OneCycle stores but never uses them.
  long long cycle_first_stair_count = 0;
  std::optional<long long> cycle_second_stair_count;
  long long decay_step_size = 0;  // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0;

  // LRRangeTest: lr_range_test_min_lr x (1 + lr_range_test_step_rate x
  // steps / lr_range_test_step_size), the quotient floored when staircase.
  double lr_range_test_min_lr = 1e-3;
  long long lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// DeepSpeed's name of the type ("WarmupCosineLR").
const char* to_string(LrScheduleType type);

}  // namespace spillway::engine
