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
  if (!dynamic()) return;
  if (overflow) {
    // The hysteresis absorbs isolated overflows; it refills only when the
    // scale grows again (DeepSpeed's default, consecutive_hysteresis false).
    if (hysteresis_left_ <= 1) {
      scale_ = std::max(scale_ / 2, options_.min_scale);
    } else {
      --hysteresis_left_;
    }
    last_overflow_iteration_ = iteration_;
  } else if ((iteration_ - last_overflow_iteration_) % options_.window == 0) {
    hysteresis_left_ = options_.hysteresis;
    scale_ *= 2;
  }
  ++iteration_;
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
