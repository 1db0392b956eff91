#include "hooks/engine/gradient_clipping.h"

#include <algorithm>

namespace spillway::engine {

ClipPath clip_path(Precision precision, int zero_stage) {
  if (zero_stage > 0) return ClipPath::zero;
  switch (precision) {
    case Precision::fp16:
      return ClipPath::fp16;
    case Precision::bf16:
      return ClipPath::bf16;
    case Precision::f32:
      return ClipPath::fp32;
  }
  return ClipPath::fp32;
}

double deepspeed_gradient_factor(ClipPath path, double global_norm, double max_norm,
                                 double loss_scale) {
  // A Python float added to or multiplied with a float32 tensor is rounded to
  // float first; each operation rounds to float.
  if (max_norm <= 0 && (path == ClipPath::fp32 || path == ClipPath::bf16)) return 1;  // no clipping
  switch (path) {
    case ClipPath::fp32: {
      const float norm = static_cast<float>(global_norm);
      const float coef = static_cast<float>(max_norm) / (norm + static_cast<float>(1e-6));
      return std::min(1.0f, coef);
    }
    case ClipPath::fp16: {
      double combined = loss_scale;
      if (max_norm > 0) {
        const double clip = ((global_norm / loss_scale) + 1e-6) / max_norm;
        if (clip > 1) combined = clip * loss_scale;
      }
      return static_cast<float>(1. / combined);
    }
    case ClipPath::bf16: {
      const float norm = static_cast<float>(global_norm);
      const float reciprocal = 1.0f / (norm + static_cast<float>(1e-6));
      const float coef = reciprocal * static_cast<float>(max_norm);
      return coef < 1 ? coef : 1.0f;
    }
    case ClipPath::zero: {
      if (max_norm <= 0) return static_cast<float>(1. / loss_scale);  // Python doubles
      // Tensor / scalar on CUDA: a product with the scalar's float reciprocal.
      const float scale = static_cast<float>(loss_scale);
      const float norm = static_cast<float>(global_norm);
      float clip = (norm * (1.0f / scale) + static_cast<float>(1e-6)) *
                   (1.0f / static_cast<float>(max_norm));
      clip = std::max(clip, 1.0f);
      const float combined = clip * scale;
      return 1.0f / combined;  // 1. / tensor: reciprocal(), times 1.0
    }
  }
  return 1;
}

}  // namespace spillway::engine
