// LossScaler: the loss scale of fp16 training, static or dynamic, with the
// update rules of DeepSpeed 0.18.
//
// fp16 gradients underflow to zero unless the loss is multiplied by a large
// factor before backward; too large a factor overflows them to inf, and that
// step is skipped. The dynamic scaler starts at 2^initial_scale_power and
// doubles the scale once `window` clean steps have passed since the last
// overflow (counted as DeepSpeed counts them: the first doubling comes after
// window + 1 clean steps from the start, window after an overflow). What an
// overflow does depends on which of DeepSpeed's optimizers the configuration
// selects (LossScaleRule). A static scale (loss_scale > 0) never changes;
// overflowed steps are still skipped.
#pragma once

#include <cstdint>

namespace spillway::engine {

// DeepSpeed 0.18 has two dynamic rules; the configuration picks one as
// DeepSpeed's engine would (EngineConfig: zero_optimization.stage).
enum class LossScaleRule {
  // FP16_Optimizer and FP16_UnfusedOptimizer (fp16 without ZeRO, stage 0):
  // every overflow halves the scale, hysteresis and consecutive_hysteresis
  // are not used, and the scale stays at min_scale once there.
  fp16_optimizer,
  // DynamicLossScaler (fp16 under ZeRO stages 1-3): an overflow halves the
  // scale only once `hysteresis` overflows have been absorbed; the hysteresis
  // refills when the scale grows (or after every clean step with
  // consecutive_hysteresis); an overflow that would halve a scale already at
  // min_scale ends the run (update() throws, as DeepSpeed raises).
  zero_optimizer,
};

struct LossScalerOptions {
  double static_scale = 0;  // > 0: this fixed scale; 0: dynamic
  int initial_scale_power = 16;
  int window = 1000;   // clean steps before the scale doubles
  int hysteresis = 2;  // zero_optimizer: overflows absorbed before the scale halves
  bool consecutive_hysteresis = false;  // zero_optimizer: a clean step refills it
  double min_scale = 1;                 // the scale never goes below it
  LossScaleRule rule = LossScaleRule::fp16_optimizer;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);

  double scale() const { return scale_; }
  bool dynamic() const { return options_.static_scale <= 0; }

  // Call once per optimizer step, with whether its gradients overflowed.
  // Throws std::runtime_error under LossScaleRule::zero_optimizer when the
  // scale would have to drop below min_scale (DeepSpeed's "Current loss scale
  // already at minimum - cannot decrease scale anymore. Exiting run.").
  void update(bool overflow);

  // Steps skipped because of an overflow, so far.
  std::uint64_t overflows() const { return overflows_; }

  // Everything update() reads, for checkpoints: restoring it into a scaler
  // of the same options continues the same sequence of scales.
  struct State {
    double scale = 1;
    int hysteresis_left = 0;
    std::int64_t iteration = 0;
    std::int64_t last_overflow_iteration = -1;
    std::uint64_t overflows = 0;
  };
  State state() const;
  // Throws std::invalid_argument on a state no update sequence reaches.
  void set_state(const State& state);

 private:
  void update_fp16_optimizer(bool overflow);
  void update_zero_optimizer(bool overflow);
  // Whether a clean step at iteration_ completes a window (DeepSpeed's
  // stable_interval test, shared by both rules).
  bool window_completed() const;

  LossScalerOptions options_;
  double scale_;
  int hysteresis_left_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_iteration_ = -1;
  std::uint64_t overflows_ = 0;
};

}  // namespace spillway::engine
