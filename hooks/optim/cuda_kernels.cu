// CUDA versions of the CPU optimizer kernels; see cuda_kernels.h for the
// contract and Note [Torch operation order] in cpu_kernel_loops.inc for the
// order of roundings both follow.
#include "hooks/optim/cuda_kernels.h"
#include "hooks/optim/update_scalars.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace spillway::optim::cuda {

namespace {

using cpu::DType;

// The same per-step scalars as the CPU kernels (update_scalars.h), so both
// round where torch rounds.
using cpu::detail::adam_scalars;
using cpu::detail::AdamScalars;
using cpu::detail::sgd_scalars;
using cpu::detail::SgdScalars;

// Element types as stored: bf16 and fp16 are raw 16-bit patterns.
struct Bf16 {
  std::uint16_t bits;
};
struct F16 {
  std::uint16_t bits;
};
struct NoLow {};

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const Bf16* p) {
  return __uint_as_float(std::uint32_t{p->bits} << 16);
}
__device__ inline float load(const F16* p) { return __half2float(__ushort_as_half(p->bits)); }

__device__ inline void store(float* p, float v) { *p = v; }
// As the CPU kernels: round to nearest even on the upper half; NaN kept, quiet.
__device__ inline void store(Bf16* p, float v) {
  const std::uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    p->bits = static_cast<std::uint16_t>((bits >> 16) | 0x40u);
    return;
  }
  p->bits = static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
__device__ inline void store(F16* p, float v) { p->bits = __half_as_ushort(__float2half_rn(v)); }

template <class Grad, class Low>
__global__ void adam_kernel(std::size_t count, float* params, const Grad* grads, float* exp_avg,
                            float* exp_avg_sq, Low* low, AdamScalars k) {
  const std::size_t stride = std::size_t{blockDim.x} * gridDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    float grad = __fmul_rn(load(grads + i), k.grad_scale);
    float param = params[i];
    if (k.decoupled_decay) param = __fmul_rn(param, k.decay_factor);
    if (k.l2_weight_decay) grad = __fmaf_rn(param, k.weight_decay, grad);
    // As the CPU kernels' first_moment (Note [Torch operation order]).
    const float difference = __fsub_rn(grad, exp_avg[i]);
    const float m = !k.first_moment_by_lerp
                        ? __fmaf_rn(grad, k.one_minus_beta1, __fmul_rn(exp_avg[i], k.beta1))
                    : k.lerp_weight_small ? __fmaf_rn(k.one_minus_beta1, difference, exp_avg[i])
                                          : __fmaf_rn(k.lerp_weight_minus_one, difference, grad);
    const float v =
        __fmaf_rn(__fmul_rn(k.one_minus_beta2, grad), grad, __fmul_rn(exp_avg_sq[i], k.beta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), k.sqrt_bias_correction2), k.eps);
    param = __fadd_rn(param, __fdiv_rn(__fmul_rn(k.neg_step_size, m), denom));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    params[i] = param;
    if constexpr (!std::is_same_v<Low, NoLow>) store(low + i, param);
  }
}

template <class Grad, class Low>
__global__ void sgd_kernel(std::size_t count, float* params, const Grad* grads, float* buffer,
                           Low* low, SgdScalars k) {
  const std::size_t stride = std::size_t{blockDim.x} * gridDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    float grad = __fmul_rn(load(grads + i), k.grad_scale);
    float param = params[i];
    if (k.has_weight_decay) grad = __fmaf_rn(param, k.weight_decay, grad);
    if (k.has_momentum) {
      const float b =
          k.first_step ? grad
                       : __fmaf_rn(grad, k.one_minus_dampening, __fmul_rn(buffer[i], k.momentum));
      buffer[i] = b;
      grad = k.nesterov ? __fmaf_rn(b, k.momentum, grad) : b;
    }
    param = __fmaf_rn(grad, k.neg_lr, param);
    params[i] = param;
    if constexpr (!std::is_same_v<Low, NoLow>) store(low + i, param);
  }
}

constexpr unsigned kThreads = 256;

unsigned blocks_for(std::size_t count) {
  // Enough blocks to fill any current GPU; the grid-stride loop does the rest.
  const std::size_t wanted = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65536 ? (wanted == 0 ? 1 : wanted) : 65536);
}

bool check_launch(const char* what, std::string* error) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return true;
  if (error != nullptr) *error = std::string(what) + ": " + cudaGetErrorString(status);
  return false;
}

// Calls launch.template operator()<Grad, Low>() for the arrays' dtypes.
template <class Launch>
bool dispatch(DType grad_dtype, const void* params_low, DType low_dtype, Launch&& launch) {
  auto with_grad = [&]<class Grad>() {
    if (params_low == nullptr) return launch.template operator()<Grad, NoLow>();
    if (low_dtype == DType::bf16) return launch.template operator()<Grad, Bf16>();
    if (low_dtype == DType::f16) return launch.template operator()<Grad, F16>();
    return launch.template operator()<Grad, float>();
  };
  switch (grad_dtype) {
    case DType::f32:
      return with_grad.template operator()<float>();
    case DType::bf16:
      return with_grad.template operator()<Bf16>();
    case DType::f16:
      return with_grad.template operator()<F16>();
  }
  return false;
}

}  // namespace

bool device_available(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason != nullptr)
      *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return false;
  }
  if (count == 0) {
    if (reason != nullptr) *reason = "no CUDA device";
    return false;
  }
  return true;
}

bool adam_step(const cpu::AdamArrays& a, const cpu::AdamConfig& config, void* stream,
               std::string* error) {
  if (a.count == 0) return true;
  const AdamScalars k = adam_scalars(config);
  auto launch = [&]<class Grad, class Low>() {
    adam_kernel<Grad, Low><<<blocks_for(a.count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        a.count, a.params, static_cast<const Grad*>(a.grads), a.exp_avg, a.exp_avg_sq,
        static_cast<Low*>(a.params_low), k);
    return check_launch("adam_step", error);
  };
  return dispatch(a.grad_dtype, a.params_low, a.params_low_dtype, launch);
}

bool sgd_step(const cpu::SgdArrays& a, const cpu::SgdConfig& config, void* stream,
              std::string* error) {
  if (a.count == 0) return true;
  const SgdScalars k = sgd_scalars(config);
  // Without momentum there is no buffer; the kernel never touches it then.
  float* buffer = k.has_momentum ? a.momentum_buffer : nullptr;
  auto launch = [&]<class Grad, class Low>() {
    sgd_kernel<Grad, Low><<<blocks_for(a.count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        a.count, a.params, static_cast<const Grad*>(a.grads), buffer,
        static_cast<Low*>(a.params_low), k);
    return check_launch("sgd_step", error);
  };
  return dispatch(a.grad_dtype, a.params_low, a.params_low_dtype, launch);
}

bool synchronize(void* stream, std::string* error) {
  const cudaError_t status = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (status == cudaSuccess) return true;
  if (error != nullptr)
    *error = std::string("cudaStreamSynchronize: ") + cudaGetErrorString(status);
  return false;
}

}  // namespace spillway::optim::cuda
