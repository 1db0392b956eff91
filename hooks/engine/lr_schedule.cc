// Each formula keeps DeepSpeed's operation order (lr_schedules.py, 0.18):
// Python floats are doubles and math.log/math.cos are the C library's, so
// the results are the same doubles. The file is compiled with
// -ffp-contract=off so no multiply-add is fused where Python rounds twice.
#include "hooks/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include <fmt/format.h>

namespace spillway::engine {

namespace {
// DeepSpeed's OneCycle writes (momentum, 0.99) as the betas.
constexpr double kOneCycleBeta2 = 0.99;
}  // namespace

LrSchedule::LrSchedule(const LrScheduleConfig& config, const OptimizerConfig& optimizer)
    : config_(config),
      base_lr_(optimizer.lr),
      cycles_momentum_(config.type == LrScheduleType::one_cycle && config.cycle_momentum &&
                       optimizer.type != OptimizerType::sgd),
      warmup_steps_(std::max(2LL, config.warmup_num_steps)),
      max_lr_(config.warmup_max_lr.value_or(optimizer.lr)),
      last_batch_iteration_(config.last_batch_iteration) {
  const double first = static_cast<double>(config.cycle_first_step_size);
  const double second =
      config.cycle_second_step_size ? static_cast<double>(*config.cycle_second_step_size) : first;
  cycle_total_size_ = first + second;
  cycle_step_ratio_ = first / cycle_total_size_;
  set_starting_values();
}

void LrSchedule::set_starting_values() {
  betas_.reset();
  if (last_batch_iteration_ != -1) {  // DeepSpeed leaves the optimizer alone
    lr_ = base_lr_;
    return;
  }
  switch (config_.type) {
    case LrScheduleType::warmup_lr:
    case LrScheduleType::warmup_decay_lr:
      lr_ = config_.warmup_min_lr;
      break;
    case LrScheduleType::warmup_cosine_lr:
      lr_ = 0.0;  // get_lr() "before it has started"
      break;
    case LrScheduleType::one_cycle:
      lr_ = config_.cycle_min_lr;
      // The lower bound, although the cycle's formula gives the upper one at
      // this point: the first step() jumps to near cycle_max_mom.
      if (cycles_momentum_) betas_ = AdamBetas{config_.cycle_min_mom, kOneCycleBeta2};
      break;
    case LrScheduleType::lr_range_test:
      lr_ = config_.lr_range_test_min_lr;
      break;
  }
}

void LrSchedule::step() {
  ++last_batch_iteration_;
  lr_ = scheduled_lr();
  if (cycles_momentum_) betas_ = scheduled_betas();
}

void LrSchedule::restore(long long last_batch_iteration) {
  if (last_batch_iteration < -1)
    throw std::invalid_argument(
        fmt::format("LrSchedule::restore: last_batch_iteration must be -1 or more, got {}",
                    last_batch_iteration));
  // No step() since construction: the optimizer still held what the
  // constructor set.
  const bool at_start =
      last_batch_iteration == -1 || last_batch_iteration == config_.last_batch_iteration;
  last_batch_iteration_ = last_batch_iteration;
  if (at_start) {
    set_starting_values();
    return;
  }
  lr_ = scheduled_lr();
  betas_ = cycles_momentum_ ? scheduled_betas() : std::nullopt;
}

// WarmupLR._get_gamma and WarmupDecayLR._get_gamma.
double LrSchedule::warmup_gamma() const {
  const long long it = last_batch_iteration_;
  if (it < warmup_steps_) {
    if (config_.warmup_type == WarmupType::log)
      return (1.0 / std::log(static_cast<double>(warmup_steps_))) *
             std::log(static_cast<double>(it + 1));
    return static_cast<double>(it) / static_cast<double>(warmup_steps_);
  }
  if (config_.type == LrScheduleType::warmup_lr) return 1.0;
  const double remaining = static_cast<double>(config_.total_num_steps - it);
  const double decay_steps =
      std::max(1.0, static_cast<double>(config_.total_num_steps - warmup_steps_));
  return std::max(0.0, remaining / decay_steps);
}

// WarmupCosineLR.get_lr_ratio. Past total_num_steps the cosine rises again,
// as DeepSpeed's does.
double LrSchedule::cosine_ratio() const {
  const long long it = last_batch_iteration_;
  if (it < warmup_steps_) {
    const double ratio = config_.warmup_type == WarmupType::log
                             ? (1.0 / std::log(static_cast<double>(warmup_steps_))) *
                                   std::log(static_cast<double>(it + 1))
                             : static_cast<double>(it) / static_cast<double>(warmup_steps_);
    return config_.warmup_min_ratio + ratio * (1.0 - config_.warmup_min_ratio);
  }
  const double real_last_step = static_cast<double>(it - warmup_steps_ + 1);
  const double real_total_steps = static_cast<double>(config_.total_num_steps - warmup_steps_);
  const double ratio = (1 + std::cos(std::numbers::pi * real_last_step / real_total_steps)) / 2;
  return std::max(0.0, config_.cos_min_ratio + (1.0 - config_.cos_min_ratio) * ratio);
}

// OneCycle._get_scale_factor: the position in the cycle, 0 at its ends and
// 1 at the peak.
double LrSchedule::one_cycle_scale() const {
  const double position = static_cast<double>(last_batch_iteration_ + 1) / cycle_total_size_;
  const double cycle = std::floor(1 + position);
  const double x = 1.0 + position - cycle;
  if (x <= cycle_step_ratio_) return x / cycle_step_ratio_;
  return (x - 1) / (cycle_step_ratio_ - 1);
}

double LrSchedule::scheduled_lr() const {
  const long long it = last_batch_iteration_;
  switch (config_.type) {
    case LrScheduleType::warmup_lr:
    case LrScheduleType::warmup_decay_lr:
      return config_.warmup_min_lr + (max_lr_ - config_.warmup_min_lr) * warmup_gamma();
    case LrScheduleType::warmup_cosine_lr:
      return base_lr_ * cosine_ratio();
    case LrScheduleType::one_cycle: {
      if (static_cast<double>(it) < cycle_total_size_)
        return config_.cycle_min_lr +
               (config_.cycle_max_lr - config_.cycle_min_lr) * one_cycle_scale();
      if (config_.decay_step_size == 0 || config_.decay_lr_rate == 0) return config_.cycle_min_lr;
      const double decay_iteration = static_cast<double>(it) - cycle_total_size_ + 1;
      const double interval = decay_iteration / static_cast<double>(config_.decay_step_size);
      return config_.cycle_min_lr / (1 + config_.decay_lr_rate * interval);
    }
    case LrScheduleType::lr_range_test: {
      const double quotient =
          static_cast<double>(it + 1) / static_cast<double>(config_.lr_range_test_step_size);
      const double interval = config_.lr_range_test_staircase ? std::floor(quotient) : quotient;
      return config_.lr_range_test_min_lr * (1 + config_.lr_range_test_step_rate * interval);
    }
  }
  return lr_;
}

// OneCycle.get_mom: beta1 falls while the lr rises, and the reverse.
std::optional<AdamBetas> LrSchedule::scheduled_betas() const {
  const long long it = last_batch_iteration_;
  double beta1 = config_.cycle_max_mom;
  if (static_cast<double>(it) < cycle_total_size_) {
    beta1 =
        config_.cycle_max_mom - (config_.cycle_max_mom - config_.cycle_min_mom) * one_cycle_scale();
  } else if (config_.decay_step_size != 0 && config_.decay_mom_rate != 0) {
    const double decay_iteration = static_cast<double>(it) - cycle_total_size_ + 1;
    const double interval = decay_iteration / static_cast<double>(config_.decay_step_size);
    beta1 = config_.cycle_max_mom * (1 + config_.decay_mom_rate * interval);
  }
  return AdamBetas{beta1, kOneCycleBeta2};
}

}  // namespace spillway::engine
