#include "bench/optim/adam_shaped_stream.h"

#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace spillway::bench {
namespace {

// Sixteen floats: one AVX-512 register, two AVX2 or four SSE ones.
using Vector = float __attribute__((vector_size(64)));

// Trivial arithmetic, so the pass is bound by memory alone; as wide vectors
// as the kernel's best variant uses (one clone per ISA, chosen at load
// time). All four loads come before the three stores, as in the kernel: the
// arrays are 4 KiB-aliased (same offset in their pages), and a load issued
// right after a store to the same page offset waits on it.
__attribute__((target_clones("avx512f", "avx2", "default"))) void stream_range(
    std::size_t begin, std::size_t end, float* p, const float* g, float* m, float* v) {
  constexpr std::size_t kWidth = sizeof(Vector) / sizeof(float);
  std::size_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    Vector grad, param, first, second;  // unaligned loads and stores: memcpy
    std::memcpy(&grad, g + i, sizeof grad);
    std::memcpy(&param, p + i, sizeof param);
    std::memcpy(&first, m + i, sizeof first);
    std::memcpy(&second, v + i, sizeof second);
    param = param + grad * -1e-7f;
    first = first * 0.9f + grad;
    second = second * 0.999f + grad * grad;
    std::memcpy(p + i, &param, sizeof param);
    std::memcpy(m + i, &first, sizeof first);
    std::memcpy(v + i, &second, sizeof second);
  }
  for (; i < end; ++i) {
    const float grad = g[i];
    p[i] = p[i] + grad * -1e-7f;
    m[i] = m[i] * 0.9f + grad;
    v[i] = v[i] * 0.999f + grad * grad;
  }
}

}  // namespace

void adam_shaped_stream(std::size_t count, float* p, const float* g, float* m, float* v,
                        int threads) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto n = static_cast<std::size_t>(omp_get_num_threads());
    stream_range(count / n * t, t + 1 == n ? count : count / n * (t + 1), p, g, m, v);
  }
#else
  // Without OpenMP the kernels run on the calling thread; so does the bound.
  (void)threads;
  stream_range(0, count, p, g, m, v);
#endif
}

}  // namespace spillway::bench
