// CPU optimizer kernels: fused elementwise Adam / AdamW / SGD updates over flat
// arrays, the per-chunk building blocks of spillway's optim::Adam, AdamW, SGD
// for host-resident chunks (design section 6).
//
// Design summary
// - One call updates one flat range: parameters (fp32, or an fp32 master copy
//   with an optional bf16/fp16 copy written back), gradients (fp32, bf16 or
//   fp16) and fp32 optimizer state. Each element is read once and written once:
//   an fp32 Adam step moves 28 bytes per parameter (p, g, m, v read; p, m, v
//   written), so it is bound by memory bandwidth, not arithmetic.
// - The math follows LibTorch's torch::optim::Adam / AdamW / SGD op by op
//   (Note [Torch operation order] in cpu_kernel_loops.inc): the per-step
//   scalars are computed in double and rounded to float where torch rounds
//   them, and "add with alpha" is a fused multiply-add, as in ATen's
//   vectorized add.
// - ISA: a scalar, an AVX2+FMA+F16C and an AVX-512 (F/BW/VL) variant of the same
//   templated loops, each compiled with its own flags (only those files), chosen
//   at run time with __builtin_cpu_supports. All variants give bit-identical
//   results: only correctly rounded operations (add, mul, div, sqrt, fma) are
//   used and contraction is off.
// - Threads: large arrays are split over a persistent pool (a split never
//   changes a result, see Note [Deterministic reductions]): the caller's
//   ParallelFor (the torch bridge passes one on at::parallel_for), else
//   OpenMP's (or the calling thread alone where OpenMP is not found). Note
//   [Kernel threads] in cpu_kernels.cc.
// - No torch: the standard library, and OpenMP where it is found.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spillway::optim::cpu {

// Instruction set of a kernel variant.
enum class Isa : std::uint8_t {
  automatic,  // the best this CPU supports (default)
  scalar,     // portable C++, any CPU
  avx2,       // AVX2 + FMA + F16C
  avx512,     // AVX-512 F + BW + VL (+ F16C)
};

// Element type of a gradient or low-precision parameter array.
enum class DType : std::uint8_t { f32, bf16, f16 };

const char* isa_name(Isa isa);
const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

// True when this CPU can run the variant (automatic and scalar: always).
bool isa_supported(Isa isa);

// The variant Isa::automatic resolves to; SPILLWAY_CPU_ISA=scalar|avx2|avx512
// in the environment caps it (read once, at first use).
Isa best_isa();

// A thread pool the kernels split a call over (the caller's: torch's, say).
// run(tasks, context, task) calls task(context, i) once for each i in
// [0, tasks), from up to `tasks` threads at once, the calling thread among
// them, and returns when every call has returned; tasks never throw.
// max_threads() is the number of threads it runs on (what num_threads = 0
// asks for); it is called once per kernel call, so it must be cheap.
using TaskFunction = void (*)(void* context, int index);
struct ParallelFor {
  void (*run)(int tasks, void* context, TaskFunction task) = nullptr;
  int (*max_threads)() = nullptr;
};

// How a kernel runs; results never depend on it.
struct ExecConfig {
  Isa isa = Isa::automatic;
  // 0: parallel_for.max_threads(), or without one OpenMP's omp_get_max_threads()
  // (OMP_NUM_THREADS, else the cores this process may use).
  int num_threads = 0;
  // Both null: OpenMP's pool (the calling thread alone where spillway was
  // built without OpenMP). Either both set or both null.
  ParallelFor parallel_for = {};
};

// The pool that ExecConfig{} runs on: "openmp" or "calling thread".
const char* default_pool_name();

// --- Conversions (round to nearest even; NaN stays NaN, quiet) ---

std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_f16(float value);  // overflow -> inf, subnormals kept
float f16_to_float(std::uint16_t bits);

// Converts count elements between fp32 and a low-precision type.
void convert_from_float(const float* source, void* destination, DType destination_dtype,
                        std::size_t count, const ExecConfig& exec = {});
void convert_to_float(const void* source, DType source_dtype, float* destination, std::size_t count,
                      const ExecConfig& exec = {});

// --- Gradient statistics (dynamic loss scaling and clipping) ---

struct GradStats {
  // Sum of squares of the gradients as stored (unscaled), accumulated in double.
  // Global norm of grads scaled by s: sqrt(sum_squares) * s.
  double sum_squares = 0.0;
  bool found_inf = false;  // some element is +-inf or NaN
};

// One pass over the gradients. Deterministic: the same for any thread count.
GradStats grad_stats(const void* grads, DType grad_dtype, std::size_t count,
                     const ExecConfig& exec = {});

// Only the overflow check (same pass; a convenience for loss scalers).
bool grads_have_inf_or_nan(const void* grads, DType grad_dtype, std::size_t count,
                           const ExecConfig& exec = {});

// --- Adam / AdamW ---

// Writes the square roots of in[0, count) to out (no overlap). Adam's square
// root may come from such a function instead of the correctly rounded one
// (Note [Square roots from torch] in cpu_kernel_loops.inc).
using SqrtFunction = void (*)(const float* in, float* out, std::size_t count);

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // false: Adam (L2 added to grad); true: AdamW
  std::int64_t step = 1;                // this step's number, 1-based (bias correction)
  float grad_scale = 1.0f;              // grads are multiplied by it first (1/loss_scale)
  // torch.optim.Adam (Python) updates exp_avg as exp_avg.lerp_(grad, 1 - beta1);
  // torch::optim::Adam (C++) as exp_avg.mul_(beta1).add_(grad, 1 - beta1).
  // They round differently; true follows the Python one, as ATen's lerp does.
  bool first_moment_by_lerp = false;
  // Null: the correctly rounded square root. Otherwise the CPU kernels take
  // sqrt(exp_avg_sq) from it, in blocks of at most kSqrtBlock elements, from
  // several threads at once; the CUDA kernels ignore it.
  SqrtFunction sqrt = nullptr;
};

// The largest count an AdamConfig::sqrt is called with.
inline constexpr std::size_t kSqrtBlock = 16384;

struct AdamArrays {
  std::size_t count = 0;
  float* params = nullptr;  // fp32 parameters, or the fp32 master copy
  const void* grads = nullptr;
  DType grad_dtype = DType::f32;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // Optional low-precision parameters, rewritten from the updated master copy.
  void* params_low = nullptr;
  DType params_low_dtype = DType::bf16;
};

// One Adam (or AdamW) step over the arrays, in place. Pointers need no
// alignment; arrays must not overlap.
void adam_step(const AdamArrays& arrays, const AdamConfig& config, const ExecConfig& exec = {});

// --- SGD ---

struct SgdConfig {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  // torch starts the momentum buffer as a copy of the first step's gradient
  // (no dampening); later steps blend into it.
  bool first_step = false;
  float grad_scale = 1.0f;
};

struct SgdArrays {
  std::size_t count = 0;
  float* params = nullptr;
  const void* grads = nullptr;
  DType grad_dtype = DType::f32;
  float* momentum_buffer = nullptr;  // required when momentum != 0, else ignored
  void* params_low = nullptr;
  DType params_low_dtype = DType::bf16;
};

void sgd_step(const SgdArrays& arrays, const SgdConfig& config, const ExecConfig& exec = {});

}  // namespace spillway::optim::cpu
