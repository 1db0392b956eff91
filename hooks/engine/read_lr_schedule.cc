#include "hooks/engine/read_lr_schedule.h"

#include <algorithm>
#include <limits>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "hooks/engine/json_fields.h"

namespace spillway::engine {
namespace {

using nlohmann::json;

constexpr const char* kParams = "scheduler.params";
constexpr double kAnyNumber = -std::numeric_limits<double>::infinity();

LrScheduleType schedule_type(const json& value) {
  if (value.is_string()) {
    const std::string name = value.get<std::string>();
    for (LrScheduleType type : {LrScheduleType::warmup_lr, LrScheduleType::warmup_decay_lr,
                                LrScheduleType::warmup_cosine_lr, LrScheduleType::one_cycle,
                                LrScheduleType::lr_range_test})
      if (name == to_string(type)) return type;
  }
  reject("scheduler.type",
         fmt::format("expected one of DeepSpeed's schedulers WarmupLR, WarmupDecayLR, "
                     "WarmupCosineLR, OneCycle, LRRangeTest (exact names, case-sensitive, as "
                     "DeepSpeed looks them up), got {}",
                     value.dump()));
}

// DeepSpeed takes null for the parameters whose Python default is None.
bool is_null_at(const json& params, const char* key) {
  return params.contains(key) && params.at(key).is_null();
}

std::optional<long long> optional_integer_at(const json& params, const char* key, long long min) {
  if (!params.contains(key) || is_null_at(params, key)) return std::nullopt;
  return integer_at(params, key, kParams, 0, min);
}

WarmupType warmup_type(const json& params) {
  if (!params.contains("warmup_type")) return WarmupType::log;
  const json& value = params.at("warmup_type");
  if (value == "log") return WarmupType::log;
  if (value == "linear") return WarmupType::linear;
  reject(join(kParams, "warmup_type"),
         fmt::format("expected \"log\" or \"linear\", got {}", value.dump()));
}

// DeepSpeed warms up over max(2, warmup_num_steps) steps.
long long effective_warmup_steps(const LrScheduleConfig& config) {
  return std::max(2LL, config.warmup_num_steps);
}

void read_warmup(const json& params, LrScheduleConfig& config) {
  config.warmup_num_steps = integer_at(params, "warmup_num_steps", kParams, 1000, 0);
  config.warmup_type = warmup_type(params);
}

void read_total_steps(const json& params, LrScheduleConfig& config, bool decay_needs_steps) {
  if (!params.contains("total_num_steps"))
    reject(join(kParams, "total_num_steps"),
           fmt::format("required by {} (an integer)", to_string(config.type)));
  config.total_num_steps = integer_at(params, "total_num_steps", kParams, 0, 0);
  const long long warmup = effective_warmup_steps(config);
  // DeepSpeed only warns when total < warmup; WarmupCosineLR then divides by
  // total - warmup, zero when they are equal.
  const bool too_few =
      decay_needs_steps ? config.total_num_steps <= warmup : config.total_num_steps < warmup;
  if (too_few)
    reject(join(kParams, "total_num_steps"),
           fmt::format("expected an integer {} warmup_num_steps ({}, at least 2 as DeepSpeed "
                       "counts it), got {}",
                       decay_needs_steps ? ">" : ">=", warmup, config.total_num_steps));
}

void read_warmup_lr(const json& params, LrScheduleConfig& config) {
  const bool decay = config.type == LrScheduleType::warmup_decay_lr;
  if (decay)
    check_keys(params, kParams,
               {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                "warmup_type", "last_batch_iteration"});
  else
    check_keys(params, kParams,
               {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                "last_batch_iteration"});
  config.warmup_min_lr = number_at(params, "warmup_min_lr", kParams, 0, 0);
  if (params.contains("warmup_max_lr") && !is_null_at(params, "warmup_max_lr"))
    config.warmup_max_lr = number_at(params, "warmup_max_lr", kParams, 0, 0);
  else if (decay && !params.contains("warmup_max_lr"))
    config.warmup_max_lr = 0.001;  // WarmupDecayLR's own default, not the optimizer's lr
  read_warmup(params, config);
  if (decay) read_total_steps(params, config, /*decay_needs_steps=*/false);
}

void read_warmup_cosine_lr(const json& params, LrScheduleConfig& config) {
  check_keys(params, kParams,
             {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
              "warmup_type", "last_batch_iteration"});
  config.warmup_min_ratio = number_at(params, "warmup_min_ratio", kParams, 0, 0);
  config.cos_min_ratio = number_at(params, "cos_min_ratio", kParams, 0.0001, 0);
  read_warmup(params, config);
  read_total_steps(params, config, /*decay_needs_steps=*/true);
}

// A momentum becomes Adam's beta1, which must lie in [0, 1).
double momentum_at(const json& params, const char* key, double fallback) {
  const double value = number_at(params, key, kParams, fallback, 0);
  if (value >= 1)
    reject(join(kParams, key),
           fmt::format("expected a number in [0, 1) (it becomes Adam's beta1), got {}", value));
  return value;
}

void read_one_cycle(const json& params, LrScheduleConfig& config) {
  check_keys(params, kParams,
             {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
              "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
              "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom",
              "decay_mom_rate", "last_batch_iteration"});
  for (const char* key : {"cycle_min_lr", "cycle_max_lr"})
    if (!params.contains(key)) reject(join(kParams, key), "required by OneCycle (a number >= 0)");
  config.cycle_min_lr = number_at(params, "cycle_min_lr", kParams, 0, 0);
  config.cycle_max_lr = number_at(params, "cycle_max_lr", kParams, 0, 0);
  // A negative rate would reach a zero divisor as the decay goes on.
  config.decay_lr_rate = number_at(params, "decay_lr_rate", kParams, 0, 0);
  // The cycle's position is divided by the first step size.
  config.cycle_first_step_size = integer_at(params, "cycle_first_step_size", kParams, 2000, 1);
  config.cycle_second_step_size = optional_integer_at(params, "cycle_second_step_size", 0);
  config.cycle_first_stair_count = integer_at(params, "cycle_first_stair_count", kParams, 0, 0);
  config.cycle_second_stair_count = optional_integer_at(params, "cycle_second_stair_count", 0);
  config.decay_step_size = integer_at(params, "decay_step_size", kParams, 0, 0);
  config.cycle_momentum = bool_at(params, "cycle_momentum", kParams, true);
  config.cycle_min_mom = momentum_at(params, "cycle_min_mom", 0.8);
  config.cycle_max_mom = momentum_at(params, "cycle_max_mom", 0.9);
  // Either sign: the decay multiplies beta1 by (1 + rate x interval).
  config.decay_mom_rate = number_at(params, "decay_mom_rate", kParams, 0, kAnyNumber);
}

void read_lr_range_test(const json& params, LrScheduleConfig& config) {
  check_keys(params, kParams,
             {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
              "lr_range_test_staircase", "last_batch_iteration"});
  config.lr_range_test_min_lr = number_at(params, "lr_range_test_min_lr", kParams, 1e-3, 0);
  config.lr_range_test_step_size = integer_at(params, "lr_range_test_step_size", kParams, 2000, 1);
  config.lr_range_test_step_rate = number_at(params, "lr_range_test_step_rate", kParams, 1.0, 0);
  config.lr_range_test_staircase = bool_at(params, "lr_range_test_staircase", kParams, false);
}

}  // namespace

LrScheduleConfig parse_lr_schedule(const json& block) {
  if (!block.is_object())
    reject("scheduler",
           fmt::format("expected an object {{\"type\", \"params\"}}, got {}", block.dump()));
  check_keys(block, "scheduler", {"type", "params"});
  if (!block.contains("type"))
    reject("scheduler.type",
           "required (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or "
           "LRRangeTest)");
  LrScheduleConfig config;
  config.type = schedule_type(block.at("type"));
  // DeepSpeed calls the scheduler with **params, which fails without them.
  if (!block.contains("params"))
    reject("scheduler.params", fmt::format("required by DeepSpeed (an object; {{}} for {}'s "
                                           "defaults)",
                                           to_string(config.type)));
  const json& params = object_at(block, "params", "scheduler");
  switch (config.type) {
    case LrScheduleType::warmup_lr:
    case LrScheduleType::warmup_decay_lr:
      read_warmup_lr(params, config);
      break;
    case LrScheduleType::warmup_cosine_lr:
      read_warmup_cosine_lr(params, config);
      break;
    case LrScheduleType::one_cycle:
      read_one_cycle(params, config);
      break;
    case LrScheduleType::lr_range_test:
      read_lr_range_test(params, config);
      break;
  }
  config.last_batch_iteration = integer_at(params, "last_batch_iteration", kParams, -1, -1);
  return config;
}

}  // namespace spillway::engine
