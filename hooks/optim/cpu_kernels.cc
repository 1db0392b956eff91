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
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

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

// Note [Kernel threads]
// A call is split into at most one range per kMinElementsPerThread elements
// and runs them on a pool that outlives the call, so no thread is started per
// call and none has to be woken on a cold core after the caller idled (a
// std::thread per call was reported to cost ~6 ms after 10-50 ms idle). The pool is the
// caller's ExecConfig::parallel_for (the torch bridge passes torch's intra-op
// pool, at::parallel_for: torch.set_num_threads and OMP_NUM_THREADS size it,
// and it is the only OpenMP runtime such a process then starts), else
// OpenMP's. Thread counts come from the pool (omp_get_max_threads reads an
// internal variable): no system call per call.
// Pinning: the pool's threads are created once, with the affinity of the
// process (libgomp's default size is the number of CPUs in the process's
// mask), not of whichever thread later calls; under OMP_PROC_BIND, OpenMP
// binds each team thread to its own place (proc_bind), where the std::threads
// this replaced inherited the main thread's one-core binding. So a caller
// pinned to one core after the first parallel call still has its ranges run
// on the other cores (KernelPool.ThreadCountsAndAPinnedCallerGiveTheSameBits in
// tests/optim/cpu_kernels_test.cc). A thread pinned before the pool's first
// parallel call passes its mask on to the threads OpenMP then creates.
// The range boundaries depend on the number of ranges only, and any split
// gives the same bits (Note [Deterministic reductions]).

#if defined(_OPENMP)
// Note [OpenMP under TSan]
// libgomp is not built with TSan, so TSan does not see that its fork and
// join order the team's work after the caller's writes and the caller's
// reads after the team's work, and reports races on everything shared. The
// annotations below state exactly those two edges (and nothing else, so races
// between the ranges are still reported) instead of suppressing reports that
// pass through libgomp. openmp_run's own accesses (the shared-variable block
// GCC hands the team, written after the release can be placed) are not
// instrumented; the tasks it calls are.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
void tsan_acquire(void* address) { __tsan_acquire(address); }
void tsan_release(void* address) { __tsan_release(address); }
#else
void tsan_acquire(void*) {}
void tsan_release(void*) {}
#endif

__attribute__((no_sanitize_thread)) void openmp_run(int tasks, void* context, TaskFunction task) {
  int fork = 0, join = 0;  // TSan sync addresses only
  tsan_release(&fork);
  // An explicit team size: the ranges were counted for it. A nested call (from
  // inside another parallel region) gets a team of one, which runs them all.
#pragma omp parallel num_threads(tasks)
  {
    tsan_acquire(&fork);
    const int team = omp_get_num_threads();
    for (int index = omp_get_thread_num(); index < tasks; index += team) task(context, index);
    tsan_release(&join);
  }
  tsan_acquire(&join);
}
int openmp_max_threads() { return omp_get_max_threads(); }
constexpr ParallelFor kDefaultPool{&openmp_run, &openmp_max_threads};
constexpr const char* kDefaultPoolName = "openmp";
#else
void calling_thread_run(int tasks, void* context, TaskFunction task) {
  for (int index = 0; index < tasks; ++index) task(context, index);
}
int one_thread() { return 1; }
constexpr ParallelFor kDefaultPool{&calling_thread_run, &one_thread};
constexpr const char* kDefaultPoolName = "calling thread";
#endif

const ParallelFor& pool_for(const ExecConfig& exec) {
  return exec.parallel_for.run != nullptr ? exec.parallel_for : kDefaultPool;
}

// How many ranges to split count elements into.
int thread_count_for(std::size_t count, const ExecConfig& exec) {
  const std::size_t useful = std::max<std::size_t>(1, count / kMinElementsPerThread);
  if (useful == 1) return 1;  // small calls ask the pool nothing
  const ParallelFor& pool = pool_for(exec);
  const int wanted = exec.num_threads > 0          ? exec.num_threads
                     : pool.max_threads != nullptr ? std::max(1, pool.max_threads())
                                                   : 1;
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(wanted), useful));
}

// The start of range t of `ranges` over [0, count).
std::size_t range_boundary(std::size_t count, int ranges, int t) {
  if (t == ranges) return count;
  const std::size_t raw = count / static_cast<std::size_t>(ranges) * static_cast<std::size_t>(t);
  return raw / kSplitAlignment * kSplitAlignment;
}

// Note [Pieces taken in turn]
// The two halves of a 2-thread call were measured to stream at different
// rates (one taking 0.86-0.95 of the other's time, so the caller waited
// 11-14% of every call for the slower half). So a call is cut into up to
// kPiecesPerThread pieces per thread, and each of the pool's tasks takes the
// next untaken piece until none is left: a thread that streams faster takes
// more pieces, whatever pool runs the tasks (torch's at::parallel_for splits
// its index range statically, so dynamic scheduling has to live here). Task t
// first runs piece t, so every thread of the team works (a caller pinned to
// one core cannot end up running the whole call while the other threads are
// still waking: OpenMP's join waits for them anyway). Any split gives the
// same bits (Note [Deterministic reductions]).
constexpr int kPiecesPerThread = 8;
constexpr std::size_t kMinElementsPerPiece = std::size_t{1} << 14;

// Calls range_fn(begin, end) on disjoint ranges covering [0, count), on the
// pool (Note [Kernel threads]) with as many threads as `work` elements are
// worth, each taking pieces in turn (Note [Pieces taken in turn]).
template <class RangeFn>
void for_each_range(std::size_t count, std::size_t work, const ExecConfig& exec,
                    const RangeFn& range_fn) {
  const int threads = thread_count_for(work, exec);
  if (threads <= 1) {
    range_fn(std::size_t{0}, count);
    return;
  }
  const std::size_t piece_limit =
      std::max<std::size_t>(static_cast<std::size_t>(threads),
                            std::min(work / kMinElementsPerPiece, count / kSplitAlignment));
  const int pieces = static_cast<int>(
      std::min<std::size_t>(static_cast<std::size_t>(threads) * kPiecesPerThread, piece_limit));
  struct Context {
    std::size_t count;
    int pieces;
    std::atomic<int> next_piece;
    const RangeFn* range_fn;
  } context{count, pieces, {threads}, &range_fn};
  const TaskFunction task = [](void* opaque, int t) {
    Context& c = *static_cast<Context*>(opaque);
    for (int p = t; p < c.pieces; p = c.next_piece.fetch_add(1, std::memory_order_relaxed))
      (*c.range_fn)(range_boundary(c.count, c.pieces, p), range_boundary(c.count, c.pieces, p + 1));
  };
  pool_for(exec).run(threads, &context, task);
}

template <class RangeFn>
void for_each_range(std::size_t count, const ExecConfig& exec, const RangeFn& range_fn) {
  for_each_range(count, count, exec, range_fn);
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

const char* default_pool_name() { return kDefaultPoolName; }

std::uint16_t float_to_bf16(float value) { return detail::portable_float_to_bf16(value); }
float bf16_to_float(std::uint16_t bits) { return detail::portable_bf16_to_float(bits); }
std::uint16_t float_to_f16(float value) { return detail::portable_float_to_f16(value); }
float f16_to_float(std::uint16_t bits) { return detail::portable_f16_to_float(bits); }

void convert_from_float(const float* source, void* destination, DType destination_dtype,
                        std::size_t count, const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  for_each_range(count, exec, [&](std::size_t begin, std::size_t end) {
    kernels.from_float(source, destination, destination_dtype, begin, end);
  });
}

void convert_to_float(const void* source, DType source_dtype, float* destination, std::size_t count,
                      const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  for_each_range(count, exec, [&](std::size_t begin, std::size_t end) {
    kernels.to_float(source, source_dtype, destination, begin, end);
  });
}

GradStats grad_stats(const void* grads, DType grad_dtype, std::size_t count,
                     const ExecConfig& exec) {
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  const std::size_t blocks = (count + kReductionBlock - 1) / kReductionBlock;
  std::vector<double> block_sums(blocks, 0.0);
  // Threads take whole blocks (Note [Deterministic reductions]).
  for_each_range(blocks * kSplitAlignment, count, exec, [&](std::size_t begin, std::size_t end) {
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
  for_each_range(arrays.count, exec, [&](std::size_t begin, std::size_t end) {
    kernels.adam(arrays, scalars, begin, end);
  });
}

void sgd_step(const SgdArrays& arrays, const SgdConfig& config, const ExecConfig& exec) {
  if (arrays.count == 0) return;
  const detail::KernelTable& kernels = kernels_for(exec.isa);
  const detail::SgdScalars scalars = detail::sgd_scalars(config);
  for_each_range(arrays.count, exec, [&](std::size_t begin, std::size_t end) {
    kernels.sgd(arrays, scalars, begin, end);
  });
}

}  // namespace spillway::optim::cpu
