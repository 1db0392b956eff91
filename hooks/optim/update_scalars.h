// The per-step scalars an optimizer update reduces to, computed once per
// call on the host and shared by the CPU kernel variants and the CUDA kernels,
// so both round exactly where torch rounds (Note [Torch operation order] in
// cpu_kernel_loops.inc).
#pragma once

#include "hooks/optim/cpu_kernels.h"

namespace spillway::optim::cpu::detail {

// Adam's per-step scalars, already rounded to float where torch rounds them.
struct AdamScalars {
  float grad_scale;
  bool l2_weight_decay;  // Adam: grad += weight_decay * param
  float weight_decay;
  bool decoupled_decay;  // AdamW: param *= decay_factor
  float decay_factor;    // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  bool first_moment_by_lerp;    // exp_avg.lerp_(grad, one_minus_beta1)
  bool lerp_weight_small;       // |one_minus_beta1| < 0.5: ATen's lerp branch
  float lerp_weight_minus_one;  // one_minus_beta1 - 1, rounded to float
  float beta2, one_minus_beta2;
  float sqrt_bias_correction2;
  float eps;
  float neg_step_size;  // -lr / bias_correction1
  SqrtFunction sqrt;    // null: Ops::sqrt
};

struct SgdScalars {
  float grad_scale;
  bool has_weight_decay;
  float weight_decay;
  bool has_momentum;
  float momentum;
  float one_minus_dampening;
  bool nesterov;
  bool first_step;
  float neg_lr;
};

AdamScalars adam_scalars(const AdamConfig& config);
SgdScalars sgd_scalars(const SgdConfig& config);

}  // namespace spillway::optim::cpu::detail
