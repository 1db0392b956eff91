// EngineConfig: a DeepSpeed-style training configuration (JSON), checked
// whole before anything is built (design section 6, initialize()).
//
// Every key a DeepSpeed 0.18 training config holds is read with DeepSpeed's
// meaning and default, accepted with no effect (and reported), or refused
// with a message naming it and what spillway offers instead:
//   optimizer {type: Adam|AdamW|SGD (any case), params {...}}   required
//   fp16 {...}, bf16 (or bfloat16) {...}, zero_optimization {...}
//   gradient_clipping, gradient_accumulation_steps, train_batch_size,
//   train_micro_batch_size_per_gpu (derived from each other as DeepSpeed does)
//   steps_per_print, wall_clock_breakdown
//   scheduler {type: WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|
//              LRRangeTest (exact), params {...}}   (read_lr_schedule.h)
//   spillway {<keys of SPILLWAY_CONF>}
// A misspelt key is an error that names it, with its path (e.g.
// "fp16.loss_scale_windw") and the keys accepted there; so is a value of the
// wrong kind. docs/deepspeed.md has the table of every key.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hooks/engine/loss_scaler.h"
#include "hooks/engine/lr_schedule_config.h"
#include "hooks/engine/zero_config.h"

namespace spillway::engine {

enum class OptimizerType { adam, adamw, sgd };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::adam;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;  // SGD
  double dampening = 0;
  bool nesterov = false;
  // DeepSpeed's torch_adam: torch.optim.Adam/AdamW instead of FusedAdam. The
  // numbers are the same (spillway's Adam is torch's); it changes one
  // default, weight_decay 0.01 for torch's AdamW instead of FusedAdam's 0.
  bool torch_adam = false;
};

enum class Precision { f32, fp16, bf16 };

struct EngineConfig {
  OptimizerConfig optimizer;
  Precision precision = Precision::f32;
  LossScalerOptions loss_scaler;  // fp16 only; its rule follows zero.stage
  double gradient_clipping = 0;   // max global norm; 0: no clipping
  int gradient_accumulation_steps = 1;
  std::optional<long long> train_batch_size;
  std::optional<long long> train_micro_batch_size_per_gpu;
  // DeepSpeed's learning-rate scheduler; nullopt: the optimizer's lr throughout.
  std::optional<LrScheduleConfig> scheduler;
  ZeroConfig zero;
  // DeepSpeed's steps_per_print: every that many optimizer steps the engine
  // prints the step line; nullopt (DeepSpeed 0.18's default): never.
  std::optional<long long> steps_per_print;
  // Print the forward/backward/step timers every step, as DeepSpeed does.
  bool wall_clock_breakdown = false;
  // The paths of the keys accepted without effect under spillway, in the
  // order read (describe_deepspeed_mapping lists them).
  std::vector<std::string> keys_without_effect;
  // The spillway block in SPILLWAY_CONF syntax, already validated; nullopt
  // when the block is absent (the environment's configuration applies).
  std::optional<std::string> spillway_conf;
};

// Throws std::invalid_argument naming the offending key and what it accepts.
EngineConfig parse_engine_config(std::string_view json_text);

const char* to_string(OptimizerType type);

// The one start-up report of what DeepSpeed would do with this configuration
// and what spillway does instead (ZeRO stage, CPU offload, keys without
// effect), one finding a line; empty when there is nothing to report.
std::string describe_deepspeed_mapping(const EngineConfig& config);

}  // namespace spillway::engine
