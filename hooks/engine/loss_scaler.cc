#include "hooks/engine/loss_scaler.h"

#include <algorithm>
#include <cmath>

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

}  // namespace spillway::engine
