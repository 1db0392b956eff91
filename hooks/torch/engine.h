// initialize(): a training engine built from a DeepSpeed-style JSON
// configuration (design section 6; the keys: hooks/engine/engine_config.h).
//
//   auto engine = spillway::initialize(model, R"({
//       "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
//       "bf16": {"enabled": true}, "gradient_clipping": 1.0,
//       "gradient_accumulation_steps": 4,
//       "spillway": {"device_budget": "6GiB"}})");
//   for (each micro-batch) {
//     torch::Tensor loss = loss_fn(engine.forward(x), y);
//     engine.backward(loss);
//     engine.step();  // steps the optimizer on every 4th call
//   }
//
// Design summary:
//  - The whole configuration is checked before anything happens, so a bad
//    one leaves the model untouched; errors name the key.
//  - The model is cast to bf16 or fp16 when enabled, managed by spillway,
//    and given spillway's optimizer, whose fp32 master copies and state live
//    in chunks.
//  - backward() scales the loss by loss_scale / gradient_accumulation_steps.
//    At an accumulation boundary step() looks at the gradients once (global
//    norm, inf/NaN): with fp16 an overflow skips the step and lowers the
//    scale; otherwise the optimizer steps with the gradients multiplied by
//    DeepSpeed's factor (1 / loss_scale and clipping, for the precision and
//    ZeRO stage: hooks/engine/gradient_clipping.h), fused into its update,
//    steps the configured scheduler (applied steps only), then zeroes them.
//  - Counters, step flags, the printed lines and the checkpoint layout are
//    DeepSpeed's (docs/deepspeed.md), so a DeepSpeed script reads the same.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "hooks/engine/engine_config.h"
#include "hooks/engine/loss_scaler.h"
#include "hooks/engine/lr_schedule.h"
#include "hooks/engine/progress_report.h"
#include "hooks/torch/optim.h"

namespace spillway {

// What initialize() builds, for any module; Engine<Holder> adds forward().
class EngineCore {
 public:
  // Throws std::invalid_argument on a configuration spillway cannot apply
  // (another configuration already active), std::runtime_error when
  // spillway cannot take the parameters.
  EngineCore(torch::nn::Module& module, engine::EngineConfig config);
  // For parameters already in compute_dtype() (a Python model, which the
  // Python package casts): throws std::invalid_argument, before anything is
  // managed, when a floating-point parameter has another dtype.
  EngineCore(std::vector<std::pair<std::string, torch::Tensor>> named_params,
             engine::EngineConfig config);
  // With an optimizer the caller built (the Python package's spillway.optim
  // optimizer, from DeepSpeed's model_parameters or a client optimizer) and
  // keeps alive for the engine's life; the configuration's optimizer block,
  // if any, is then not used.
  EngineCore(std::vector<std::pair<std::string, torch::Tensor>> named_params,
             engine::EngineConfig config, optim::ChunkedOptimizer& optimizer);
  EngineCore(EngineCore&&) = default;
  EngineCore& operator=(EngineCore&&) = default;
  virtual ~EngineCore() = default;

  // Backward of the loss, scaled for fp16 and gradient accumulation.
  void backward(const torch::Tensor& loss);
  // Ends a micro-batch. At an accumulation boundary, steps the optimizer
  // (or skips the step on an fp16 overflow) and zeroes the gradients.
  // Returns whether the optimizer stepped.
  bool step();

  // DeepSpeed's: whether the next step() ends an accumulation window.
  bool is_gradient_accumulation_boundary() const;
  // Whether the last step() updated the parameters (false between
  // accumulation boundaries and on a skipped fp16 step).
  bool was_step_applied() const { return step_applied_; }
  // Drops the gradients (the managed gradients are zeroed in their chunks).
  void zero_grad();
  // Each parameter group's learning rate, as the next optimizer step uses it.
  std::vector<double> get_lr() const;
  // Each group's momentum setting: Adam's {beta1, beta2}, SGD's {momentum}.
  std::vector<std::vector<double>> group_momentum() const;
  // The configuration's scheduler (DeepSpeed's order, hooks/engine/
  // lr_schedule.h): one LrSchedule per parameter group, from the group's own
  // starting lr, advanced after every applied step. last_batch_iteration is
  // its DeepSpeed state; -1 before the first step, nullopt without one.
  bool has_lr_schedule() const { return !schedules_.empty(); }
  std::optional<long long> lr_schedule_iteration() const;
  // Advances the schedule by one step (what the engine does after an applied
  // step), or restores it to a saved iteration; both set the groups' lr.
  void step_lr_schedule();
  void restore_lr_schedule(long long last_batch_iteration);
  double loss_scale() const { return scaler_.scale(); }
  // Global norm of the last boundary's gradients (unscaled, before clipping).
  double last_gradient_norm() const { return last_norm_; }
  // DeepSpeed's counters: global_steps counts accumulation boundaries,
  // skipped ones included; global_samples adds train_batch_size each time.
  std::uint64_t global_steps() const { return global_steps_; }
  std::uint64_t global_samples() const { return global_samples_; }
  std::uint64_t skipped_steps() const { return skipped_steps_; }
  std::uint64_t micro_steps() const { return micro_steps_; }
  // The dtype of parameters and activations (float, bf16 or half).
  torch::Dtype compute_dtype() const;
  const engine::EngineConfig& config() const { return config_; }
  optim::ChunkedOptimizer& optimizer() { return *optimizer_; }

  // Time spent in the module's forward, for wall_clock_breakdown's lines
  // (the forward wrappers report it; backward and step are timed here).
  void add_forward_time(double milliseconds);

  // What a checkpoint holds beside the module, the optimizer and the
  // learning-rate schedule (lr_schedule_iteration): counters and the loss
  // scaler. Restoring it into an engine of the same configuration resumes
  // bit-identically.
  struct State {
    std::uint64_t micro_steps = 0;
    std::uint64_t global_steps = 0;
    std::uint64_t global_samples = 0;
    std::uint64_t skipped_steps = 0;
    double last_gradient_norm = 0;
    engine::LossScaler::State loss_scaler;
  };
  State state() const;
  void set_state(const State& state);
  // The same, with the schedule's iteration, in a torch archive (C++
  // checkpoints).
  void save_state(torch::serialize::OutputArchive& archive) const;
  void load_state(torch::serialize::InputArchive& archive);

  // DeepSpeed's checkpoint layout (docs/deepspeed.md): dir/tag/
  // mp_rank_00_model_states.pt holds `module`'s parameters and buffers by
  // name, the engine's state and, at ZeRO stage 0, the optimizer; at stages
  // 1-3 the optimizer is in dir/tag/[bf16_]zero_pp_rank_0_mp_rank_00_optim_
  // states.pt. dir/latest names the tag. An empty tag is DeepSpeed's
  // "global_step<N>". Tensors are read and written through ops, so their
  // values are true even where chunks are spilled; each file is written
  // beside its name, then renamed.
  void save_checkpoint(torch::nn::Module& module, const std::string& dir, std::string tag,
                       bool save_latest);
  // Loads what save_checkpoint wrote (an empty tag: the one dir/latest
  // names) and returns the model file's path. Throws std::runtime_error
  // naming the file when one is missing, and std::invalid_argument when a
  // parameter or buffer is missing, unexpected, or of another shape.
  std::string load_checkpoint(torch::nn::Module& module, const std::string& dir, std::string tag);

 private:
  // Manages the parameters and builds the optimizer over the trainable ones.
  void take_parameters(std::vector<std::pair<std::string, torch::Tensor>> named_params);
  // Builds the schedules over the optimizer's groups and applies them.
  void start_lr_schedule();
  // Writes the schedules' lr (and betas) into the optimizer's groups.
  void apply_lr_schedule();
  // steps_per_print's and wall_clock_breakdown's lines, after a step().
  void report_progress(bool boundary, double step_ms);

  engine::EngineConfig config_;
  engine::LossScaler scaler_;
  std::unique_ptr<optim::ChunkedOptimizer> owned_optimizer_;
  optim::ChunkedOptimizer* optimizer_ = nullptr;
  std::vector<torch::Tensor> trainable_;       // in the module's order, for the fp32 clip norm
  std::vector<engine::LrSchedule> schedules_;  // one per parameter group
  double last_norm_ = 0;
  engine::StepTimes micro_times_;   // since the last step()
  engine::StepTimes window_times_;  // since the last accumulation boundary
  bool step_applied_ = false;
  std::uint64_t micro_steps_ = 0;
  std::uint64_t global_steps_ = 0;
  std::uint64_t global_samples_ = 0;
  std::uint64_t skipped_steps_ = 0;
};

template <typename ModuleHolder>
class Engine : public EngineCore {
 public:
  Engine(ModuleHolder model, engine::EngineConfig config)
      : EngineCore(*model, std::move(config)), model_(std::move(model)) {}

  template <typename... Inputs>
  auto forward(Inputs&&... inputs) {
    const auto start = std::chrono::steady_clock::now();
    auto out = model_->forward(std::forward<Inputs>(inputs)...);
    add_forward_time(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    return out;
  }
  ModuleHolder& module() { return model_; }
  void train(bool on = true) { model_->train(on); }
  void eval() { model_->eval(); }

  void save_checkpoint(const std::string& dir, std::string tag = "", bool save_latest = true) {
    EngineCore::save_checkpoint(*model_, dir, std::move(tag), save_latest);
  }
  std::string load_checkpoint(const std::string& dir, std::string tag = "") {
    return EngineCore::load_checkpoint(*model_, dir, std::move(tag));
  }

 private:
  ModuleHolder model_;
};

// Builds an engine for `model` (a module holder such as torch::nn::Linear,
// or a std::shared_ptr to a module). Throws std::invalid_argument naming the
// first bad key of `config_json`.
template <typename ModuleHolder>
Engine<ModuleHolder> initialize(ModuleHolder model, const std::string& config_json) {
  return Engine<ModuleHolder>(std::move(model), engine::parse_engine_config(config_json));
}

}  // namespace spillway
