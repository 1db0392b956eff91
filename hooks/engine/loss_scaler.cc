#include "hooks/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace spillway::engine {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options),
      scale_(options.static_scale > 0 ? options.static_scale
                                      : std::ldexp(1.0, options.initial_scale_power)),
      hysteresis_left_(options.hysteresis) {}

void LossScaler::update(bool overflow) {
  if (overflow) ++overflows_;
  if (dynamic()) {
    if (options_.rule == LossScaleRule::fp16_optimizer) {
      update_fp16_optimizer(overflow);
    } else {
      update_zero_optimizer(overflow);
    }
  }
  ++iteration_;
}

bool LossScaler::window_completed() const {
  // The clean steps strictly between the last overflow and this one.
  const std::int64_t stable_interval = iteration_ - last_overflow_iteration_ - 1;
  return stable_interval > 0 && stable_interval % options_.window == 0;
}

void LossScaler::update_fp16_optimizer(bool overflow) {
  if (overflow) {
    scale_ = std::max(scale_ / 2, options_.min_scale);
    last_overflow_iteration_ = iteration_;
  } else if (window_completed()) {
    scale_ *= 2;
  }
}

void LossScaler::update_zero_optimizer(bool overflow) {
  if (overflow) {
    if (options_.hysteresis == 1 || hysteresis_left_ == 1) {
      if (scale_ == options_.min_scale)
        throw std::runtime_error(
            "loss scale already at its minimum (fp16.min_loss_scale) and the step overflowed "
            "again: cannot decrease the scale any more, the run stops (as DeepSpeed's "
            "DynamicLossScaler does)");
      scale_ = std::max(scale_ / 2, options_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iteration_ = iteration_;
    return;
  }
  if (options_.consecutive_hysteresis) hysteresis_left_ = options_.hysteresis;
  if (window_completed()) {
    if (!options_.consecutive_hysteresis) hysteresis_left_ = options_.hysteresis;
    scale_ *= 2;
  }
}

LossScaler::State LossScaler::state() const {
  return {scale_, hysteresis_left_, iteration_, last_overflow_iteration_, overflows_};
}

void LossScaler::set_state(const State& state) {
  if (!(state.scale > 0) || !std::isfinite(state.scale) || state.hysteresis_left < 0 ||
      state.iteration < 0 || state.last_overflow_iteration < -1 ||
      state.last_overflow_iteration >= state.iteration)
    throw std::invalid_argument("loss scaler: inconsistent state (scale " +
                                std::to_string(state.scale) + ", iteration " +
                                std::to_string(state.iteration) + ")");
  scale_ = state.scale;
  hysteresis_left_ = state.hysteresis_left;
  iteration_ = state.iteration;
  last_overflow_iteration_ = state.last_overflow_iteration;
  overflows_ = state.overflows;
}

}  // namespace spillway::engine
