#include "bench/optim/adam_shaped_stream.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

__attribute__((target_clones("avx512f", "avx2", "default"))) float read_range(
    std::size_t begin, std::size_t end, const float* p, const float* g, const float* m,
    const float* v) {
  constexpr std::size_t kWidth = sizeof(Vector) / sizeof(float);
  Vector sum{};
  std::size_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    Vector a, b, c, d;
    std::memcpy(&a, p + i, sizeof a);
    std::memcpy(&b, g + i, sizeof b);
    std::memcpy(&c, m + i, sizeof c);
    std::memcpy(&d, v + i, sizeof d);
    sum += (a + b) + (c + d);
  }
  float total = 0.0f;
  for (std::size_t lane = 0; lane < kWidth; ++lane) total += sum[lane];
  for (; i < end; ++i) total += p[i] + g[i] + m[i] + v[i];
  return total;
}

#if defined(__x86_64__)
// One array's range with streaming stores, widest first: a store of a full
// aligned vector; the unaligned head and the tail with ordinary stores.
__attribute__((target("avx512f"))) std::size_t nt_fill_avx512(float* out, std::size_t count,
                                                              float value) {
  const __m512 vector = _mm512_set1_ps(value);
  std::size_t i = 0;
  for (; i + 16 <= count; i += 16) _mm512_stream_ps(out + i, vector);
  return i;
}

__attribute__((target("avx2"))) std::size_t nt_fill_avx2(float* out, std::size_t count,
                                                         float value) {
  const __m256 vector = _mm256_set1_ps(value);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_stream_ps(out + i, vector);
  return i;
}

std::size_t nt_fill_sse(float* out, std::size_t count, float value) {
  const __m128 vector = _mm_set1_ps(value);
  std::size_t i = 0;
  for (; i + 4 <= count; i += 4) _mm_stream_ps(out + i, vector);
  return i;
}
#endif

void nt_fill(float* out, std::size_t count, float value) {
  std::size_t head = 0;
#if defined(__x86_64__)
  // Streaming stores need their vector's alignment: 64 bytes covers all three.
  while (head < count && reinterpret_cast<std::uintptr_t>(out + head) % 64 != 0) {
    out[head++] = value;
  }
  float* aligned = out + head;
  const std::size_t rest = count - head;
  std::size_t done = 0;
  if (__builtin_cpu_supports("avx512f")) {
    done = nt_fill_avx512(aligned, rest, value);
  } else if (__builtin_cpu_supports("avx2")) {
    done = nt_fill_avx2(aligned, rest, value);
  } else {
    done = nt_fill_sse(aligned, rest, value);
  }
  _mm_sfence();  // streaming stores are weakly ordered: drain them before the timer stops
  head += done;
#endif
  for (; head < count; ++head) out[head] = value;  // elsewhere: ordinary stores
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

float adam_read_pass(std::size_t count, const float* p, const float* g, const float* m,
                     const float* v, int threads) {
  float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto n = static_cast<std::size_t>(omp_get_num_threads());
    total += read_range(count / n * t, t + 1 == n ? count : count / n * (t + 1), p, g, m, v);
  }
#else
  (void)threads;
  total = read_range(0, count, p, g, m, v);
#endif
  return total;
}

void adam_nt_write_pass(std::size_t count, float* p, float* m, float* v, int threads) {
  auto write_range = [&](std::size_t begin, std::size_t end) {
    nt_fill(p + begin, end - begin, 0.5f);
    nt_fill(m + begin, end - begin, 0.0f);
    nt_fill(v + begin, end - begin, 0.0f);
  };
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const auto t = static_cast<std::size_t>(omp_get_thread_num());
    const auto n = static_cast<std::size_t>(omp_get_num_threads());
    write_range(count / n * t, t + 1 == n ? count : count / n * (t + 1));
  }
#else
  (void)threads;
  write_range(0, count);
#endif
}

}  // namespace spillway::bench
