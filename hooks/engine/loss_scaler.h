// LossScaler: the loss scale of fp16 training, static or dynamic, with the
// update rule of DeepSpeed's fp16 block.
//
// fp16 gradients underflow to zero unless the loss is multiplied by a large
// factor before backward; too large a factor overflows them to inf. The
// dynamic scaler starts high (2^initial_scale_power), halves the scale when a
// step overflowed (that step is skipped), after `hysteresis` overflows in a
// row, and doubles it after `window` steps without overflow. A static scale
// (loss_scale > 0) never changes; overflowed steps are still skipped.
#pragma once

#include <cstdint>

namespace spillway::engine {

struct LossScalerOptions {
  double static_scale = 0;  // > 0: this fixed scale; 0: dynamic
  int initial_scale_power = 16;
  int window = 1000;     // good steps before the scale doubles
  int hysteresis = 2;    // overflows tolerated before the scale halves
  double min_scale = 1;  // the scale never goes below it
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options);

  double scale() const { return scale_; }
  bool dynamic() const { return options_.static_scale <= 0; }

  // Call once per optimizer step, with whether its gradients overflowed.
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
  LossScalerOptions options_;
  double scale_;
  int hysteresis_left_;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_iteration_ = -1;
  std::uint64_t overflows_ = 0;
};

}  // namespace spillway::engine
