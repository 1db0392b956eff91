// The gradient-clipping factor of DeepSpeed 0.18: what the gradients are
// multiplied by before the optimizer step, computed with DeepSpeed's formula
// in DeepSpeed's floating-point order, so a spillway step clips exactly as a
// DeepSpeed step does for the same global norm.
//
// DeepSpeed clips in a different place for each precision (without ZeRO,
// which is what one process runs); ClipPath names them:
//   fp32  engine.clip_fp32_gradients -> runtime/utils.clip_grad_norm_: float32
//         tensors, coef = max_norm / (norm + 1e-6), min(1, coef).
//   fp16  FP16_Optimizer.unscale_and_clip_grads: Python doubles on the norm of
//         the still-scaled gradients, clip = ((norm / scale) + 1e-6) / max_norm,
//         combined = clip * scale when clip > 1 (else scale); the fp32 master
//         gradients are multiplied by 1. / combined, which unscales and clips
//         in one multiplication (rounded to float, as torch's mul_ does).
//   bf16  BF16_Optimizer.step -> runtime/utils.clip_tensors_by_global_norm:
//         float32 tensors, coef = reciprocal(norm + 1e-6) * max_norm (Python's
//         scalar / tensor is a reciprocal and a product), applied when < 1.
// ZeRO stages 1-3 clip with float32 tensor arithmetic whose division by a
// scalar differs between CPU and CUDA; spillway follows the paths above.
#pragma once

#include "hooks/engine/engine_config.h"

namespace spillway::engine {

enum class ClipPath { fp32, fp16, bf16 };

// The path DeepSpeed takes for the configuration's precision.
ClipPath clip_path(Precision precision);

// The factor the gradients are multiplied by in a step whose global L2 norm is
// `global_norm`: for fp16, the norm of the loss-scaled gradients and a factor
// that also removes `loss_scale`; for fp32 and bf16, the true norm (loss_scale
// is ignored) and a factor in (0, 1]. `max_norm` is gradient_clipping, > 0;
// with fp16 and max_norm 0 (no clipping) the factor only unscales.
double deepspeed_gradient_factor(ClipPath path, double global_norm, double max_norm,
                                 double loss_scale);

}  // namespace spillway::engine
