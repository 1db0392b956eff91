// The gradient-clipping factor of DeepSpeed 0.18: what the gradients are
// multiplied by before the optimizer step, computed with DeepSpeed's formula
// in DeepSpeed's floating-point order, so a spillway step clips exactly as a
// DeepSpeed step does for the same global norm.
//
// DeepSpeed clips in a different place for each precision without ZeRO, and
// in its ZeRO optimizer with ZeRO; ClipPath names them:
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
//   zero  DeepSpeedZeroOptimizer(_Stage3).unscale_and_clip_grads (stages 1-3,
//         every precision, loss scale 1 unless fp16): float32 tensors,
//         clip = ((norm / scale) + 1e-6) / max_norm, clamped to >= 1,
//         combined = clip * scale, gradients multiplied by 1. / combined. A
//         float32 tensor divided by a Python scalar is a true division on the
//         CPU but a product with the scalar's float reciprocal on CUDA
//         (torch's div_true_kernel_cuda); the GPU is where the engine runs, so
//         this follows CUDA. The two agree when max_norm and the scale are
//         powers of two, which is what the CPU parity test checks.
#pragma once

#include "hooks/engine/engine_config.h"

namespace spillway::engine {

enum class ClipPath { fp32, fp16, bf16, zero };

// The path DeepSpeed takes for the configuration's precision and ZeRO stage.
ClipPath clip_path(Precision precision, int zero_stage);

// The factor the gradients are multiplied by in a step whose global L2 norm
// is `global_norm`. fp16 and zero: the norm of the gradients as they are
// (loss-scaled under fp16), and a factor that also removes `loss_scale` (1
// unless fp16). fp32 and bf16: the true norm (loss_scale ignored), a factor in
// (0, 1]. `max_norm` is gradient_clipping; 0 means no clipping (the factor
// only unscales).
double deepspeed_gradient_factor(ClipPath path, double global_norm, double max_norm,
                                 double loss_scale);

}  // namespace spillway::engine
