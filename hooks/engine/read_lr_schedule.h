// Reading the `scheduler` block of a DeepSpeed configuration into an
// LrScheduleConfig, every key checked.
//
// DeepSpeed's engine calls getattr(lr_schedules, T)(optimizer, **params): the
// type name is exact (case-sensitive) and `params` is required; a key the
// scheduler's constructor does not take, or a missing required one, is a
// TypeError. Here each of those, a value of the wrong kind, and a value that
// would make DeepSpeed divide by zero or run a schedule it only warns about
// (total_num_steps below warmup_num_steps) is a std::invalid_argument naming
// the key, e.g. "scheduler.params.warmup_num_steps". Differences on purpose:
// per-parameter-group lists are refused (spillway's engine has one group), an
// unknown warmup_type is refused (DeepSpeed warns and uses log), and torch's
// own schedulers, which DeepSpeed also looks up by name, are refused.
//
// Not included by engine_config.h, so that the installed headers need no
// nlohmann_json.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "hooks/engine/lr_schedule_config.h"

namespace spillway::engine {

// Reads the `scheduler` block (the value of the top-level key); throws
// std::invalid_argument naming the offending key and what it accepts.
LrScheduleConfig parse_lr_schedule(const nlohmann::json& block);

}  // namespace spillway::engine
