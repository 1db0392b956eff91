// EngineConfig: a DeepSpeed-style training configuration (JSON), checked
// whole before anything is built (design section 6, initialize()).
//
// Accepted, each key optional unless said otherwise:
//   optimizer {type: Adam|AdamW|SGD (any case), params {...}}   required
//   fp16 {enabled, loss_scale, initial_scale_power, loss_scale_window,
//         hysteresis, min_loss_scale}
//   bf16 {enabled}
//   gradient_clipping, gradient_accumulation_steps,
//   train_batch_size, train_micro_batch_size_per_gpu (checked for consistency)
//   scheduler {type: WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|
//              LRRangeTest (exact), params {...}}   (read_lr_schedule.h)
//   spillway {<keys of SPILLWAY_CONF>}
// Any other key is an error that names it, with its path (e.g.
// "fp16.loss_scale_windw"); so is a value of the wrong kind. Defaults are
// DeepSpeed's: weight_decay 0, and "Adam" decouples weight decay (AdamW)
// unless optimizer.params.adam_w_mode is false. docs/engine.md has the table.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "hooks/engine/loss_scaler.h"
#include "hooks/engine/lr_schedule_config.h"

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
};

enum class Precision { f32, fp16, bf16 };

struct EngineConfig {
  OptimizerConfig optimizer;
  Precision precision = Precision::f32;
  LossScalerOptions loss_scaler;  // fp16 only
  double gradient_clipping = 0;   // max global norm; 0: no clipping
  int gradient_accumulation_steps = 1;
  std::optional<long long> train_batch_size;
  std::optional<long long> train_micro_batch_size_per_gpu;
  // DeepSpeed's learning-rate scheduler; nullopt: the optimizer's lr throughout.
  std::optional<LrScheduleConfig> scheduler;
  // The spillway block in SPILLWAY_CONF syntax, already validated; nullopt
  // when the block is absent (the environment's configuration applies).
  std::optional<std::string> spillway_conf;
};

// Throws std::invalid_argument naming the offending key and what it accepts.
EngineConfig parse_engine_config(std::string_view json_text);

const char* to_string(OptimizerType type);

}  // namespace spillway::engine
