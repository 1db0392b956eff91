// Public entry points of the CPU optimizer kernels: ISA selection, per-step
// scalars (computed as LibTorch computes them), and splitting a call over
// threads. The loops themselves are in cpu_kernel_loops.inc.
//
// Note [Deterministic reductions]
// Elementwise updates are computed identically wherever a range is split (the
// loops pad tails instead of switching to other code), so any thread split
// gives the same bits. The sum of squares is taken over fixed blocks of
// kReductionBlock elements, each reduced in a fixed lane order, and the block
// sums are added in block order: the same result for any thread count.
#include "hooks/optim/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

#include "hooks/optim/cpu_kernel_internal.h"

namespace spillway::optim::cpu {
namespace {

// Below this many elements per thread, another thread costs more than it saves.
constexpr std::size_t kMinElementsPerThread = std::size_t{1} << 16;
// Thread ranges start on multiples of this (a 64-byte line even for bf16 data),
// so two threads never write the same cache line.
constexpr std::size_t kSplitAlignment = 64;
constexpr std::size_t kReductionBlock = std::size_t{1} << 16;

// The SIMD variants are built on x86-64 only (hooks/optim/CMakeLists.txt).
#if defined(__x86_64__)
bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx512() { return false; }
#endif

Isa detect_best_isa() {
  Isa best = cpu_has_avx512() ? Isa::avx512 : cpu_has_avx2() ? Isa::avx2 : Isa::scalar;
  // SPILLWAY_CPU_ISA caps the choice (to compare variants, or to dodge AVX-512
  // clock throttling on some parts).
  if (const char* cap = std::getenv("SPILLWAY_CPU_ISA")) {
    const std::string_view name(cap);
    if (name == "scalar") best = Isa::scalar;
    if (name == "avx2" && best == Isa::avx512) best = Isa::avx2;
  }
  return best;
}

const detail::KernelTable& kernels_for(Isa isa) {
  if (isa == Isa::automatic) isa = best_isa();
  if (!isa_supported(isa)) isa = best_isa();  // a request this CPU cannot run
#if defined(__x86_64__)
  if (isa == Isa::avx512) return detail::avx512_kernel_table();
  if (isa == Isa::avx2) return detail::avx2_kernel_table();
#endif
  return detail::scalar_kernel_table();
}

int thread_count_for(std::size_t count, int requested) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int wanted = requested > 0 ? requested : cores;
  const std::size_t useful = std::max<std::size_t>(1, count / kMinElementsPerThread);
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(wanted), useful));
}

// Calls range_fn(begin, end) on `threads` disjoint ranges covering [0, count),
// the last on the calling thread. Threads are started per call: at the sizes
// that use them (>= 64K elements each) that costs well under 1% of the work.
template <class RangeFn>
void for_each_range(std::size_t count, int threads, const RangeFn& range_fn) {
  if (threads <= 1) {
    range_fn(std::size_t{0}, count);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(threads) - 1);
  auto boundary = [&](int t) {
    if (t == threads) return count;
    const std::size_t raw = count / static_cast<std::size_t>(threads) * static_cast<std::size_t>(t);
    return raw / kSplitAlignment * kSplitAlignment;
  };
  for (int t = 0; t + 1 < threads; ++t) {
    workers.emplace_back([&, t] { range_fn(boundary(t), boundary(t + 1)); });
  }
  range_fn(boundary(threads - 1), count);
  for (std::thread& worker : workers) worker.join();
}

}  // namespace

namespace detail {

AdamScalars adam_scalars(const AdamConfig& config) {
  // As torch: bias corrections and step size in double, then float per kernel.
  const double step = static_cast<double>(config.step);
  const double bias_correction1 = 1.0 - std::pow(config.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(config.beta2, step);
  AdamScalars s{};
  s.grad_scale = config.grad_scale;
  s.l2_weight_decay = !config.decoupled_weight_decay && config.weight_decay != 0.0;
  s.weight_decay = static_cast<float>(config.weight_decay);
  s.decoupled_decay = config.decoupled_weight_decay && config.weight_decay != 0.0;
  s.decay_factor = static_cast<float>(1.0 - config.lr * config.weight_decay);
  s.beta1 = static_cast<float>(config.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
  s.first_moment_by_lerp = config.first_moment_by_lerp;
  s.lerp_weight_small = std::fabs(s.one_minus_beta1) < 0.5f;
  s.lerp_weight_minus_one = s.one_minus_beta1 - 1.0f;
  s.beta2 = static_cast<float>(config.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(config.eps);
  s.neg_step_size = static_cast<float>(-(config.lr / bias_correction1));
  s.sqrt = config.sqrt;
  return s;
}

SgdScalars sgd_scalars(const SgdConfig& config) {
  SgdScalars s{};
  s.grad_scale = config.grad_scale;
  s.has_weight_decay = config.weight_decay != 0.0;
  s.weight_decay = static_cast<float>(config.weight_decay);
  s.has_momentum = config.momentum != 0.0;
  s.momentum = static_cast<float>(config.momentum);
  s.one_minus_dampening = static_cast<float>(1.0 - config.dampening);
  s.nesterov = config.nesterov;
  s.first_step = config.first_step;
  s.neg_lr = static_cast<float>(-1 * config.lr);
  return s;
}

}  // namespace detail

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::automatic:
      return "automatic";
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "unknown";
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
  }
  return "unknown";
}

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::automatic:
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return cpu_has_avx2();
    case Isa::avx512:
      return cpu_has_avx512();
  }
  return false;
}

Isa best_isa() {
  static const Isa best = detect_best_isa();
  return best;
}

std::uint16_t float_to_bf16(float value) { return detail::portable_float_to_bf16(value); }
float bf16_to_float(std::uint16_t bits) { return detail::portable_bf16_to_float(bits); }
std::uint16_t float_to_f16(float value) { return detail::portable_float_to_f16(value); }
float f16_to_float(std::uint16_t bits) { return detail::portable_f16_to_float(bits); }

void convert_from_float(const float* source, void* destination, DType destination_dtype,
                        std::size_t count, const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  for_each_range(count, thread_count_for(count, exec.num_threads),
                 [&](std::size_t begin, std::size_t end) {
                   kernels.from_float(source, destination, destination_dtype, begin, end);
                 });
}

void convert_to_float(const void* source, DType source_dtype, float* destination, std::size_t count,
                      const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  for_each_range(count, thread_count_for(count, exec.num_threads),
                 [&](std::size_t begin, std::size_t end) {
                   kernels.to_float(source, source_dtype, destination, begin, end);
                 });
}

GradStats grad_stats(const void* grads, DType grad_dtype, std::size_t count,
                     const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  const std::size_t blocks = (count + kReductionBlock - 1) / kReductionBlock;
  std::vector<double> block_sums(blocks, 0.0);
  // Threads take whole blocks (Note [Deterministic reductions]).
  const int threads = thread_count_for(count, exec.num_threads);
  for_each_range(blocks * kSplitAlignment, threads, [&](std::size_t begin, std::size_t end) {
    for (std::size_t block = begin / kSplitAlignment; block < end / kSplitAlignment; ++block) {
      const std::size_t first = block * kReductionBlock;
      const std::size_t last = std::min(count, first + kReductionBlock);
      block_sums[block] = kernels.sum_squares(grads, grad_dtype, first, last);
    }
  });
  GradStats stats;
  for (double block_sum : block_sums) stats.sum_squares += block_sum;
  // A squared float can't overflow a double, so only inf/NaN inputs end here.
  stats.found_inf = !std::isfinite(stats.sum_squares);
  return stats;
}

bool grads_have_inf_or_nan(const void* grads, DType grad_dtype, std::size_t count,
                           const ExecConfig& exec) {
  return grad_stats(grads, grad_dtype, count, exec).found_inf;
}

void adam_step(const AdamArrays& arrays, const AdamConfig& config, const ExecConfig& exec) {
  if (arrays.count == 0) return;
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  const detail::AdamScalars scalars = detail::adam_scalars(config);
  for_each_range(
      arrays.count, thread_count_for(arrays.count, exec.num_threads),
      [&](std::size_t begin, std::size_t end) { kernels.adam(arrays, scalars, begin, end); });
}

void sgd_step(const SgdArrays& arrays, const SgdConfig& config, const ExecConfig& exec) {
  if (arrays.count == 0) return;
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  const detail::SgdScalars scalars = detail::sgd_scalars(config);
  for_each_range(
      arrays.count, thread_count_for(arrays.count, exec.num_threads),
      [&](std::size_t begin, std::size_t end) { kernels.sgd(arrays, scalars, begin, end); });
}

}  // namespace spillway::optim::cpu
