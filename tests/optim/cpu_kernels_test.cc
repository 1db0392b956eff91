// CPU optimizer kernels: each ISA variant this CPU supports against the
// scalar variant (bit for bit: they share roundings, Note [Torch operation
// order]) and against a plain double-precision reference; odd lengths and
// unaligned pointers; threads vs one thread (bit for bit); SGD variants; the
// gradient statistics behind loss scaling and clipping.
#include <sched.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "hooks/optim/cpu_kernels.h"
#include "tests/optim/pin_calling_thread.h"

namespace spillway::optim::cpu {
namespace {

constexpr double kFloatEpsilon = 0x1p-23;

// One optimizer's arrays, each offset by `misalign` elements from a vector's
// start so the kernels see unaligned pointers.
struct TestArrays {
  TestArrays(std::size_t count, DType grad_dtype, std::size_t misalign, std::uint64_t seed)
      : count(count), grad_dtype(grad_dtype), misalign(misalign) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    params.resize(count + misalign);
    exp_avg.resize(count + misalign);
    exp_avg_sq.resize(count + misalign);
    grads_f32.resize(count + misalign);
    grads_low.resize(count + misalign);
    for (std::size_t i = 0; i < count + misalign; ++i) {
      params[i] = normal(rng);
      exp_avg[i] = 0.01f * normal(rng);
      exp_avg_sq[i] = 0.001f * std::fabs(normal(rng));
      const float grad = 0.1f * normal(rng);
      grads_f32[i] = grad;
      grads_low[i] = grad_dtype == DType::f16 ? float_to_f16(grad) : float_to_bf16(grad);
    }
  }
  float* p() { return params.data() + misalign; }
  float* m() { return exp_avg.data() + misalign; }
  float* v() { return exp_avg_sq.data() + misalign; }
  const void* g() const {
    return grad_dtype == DType::f32 ? static_cast<const void*>(grads_f32.data() + misalign)
                                    : static_cast<const void*>(grads_low.data() + misalign);
  }
  // The gradient as the kernel sees it, before scaling.
  float grad_value(std::size_t i) const {
    switch (grad_dtype) {
      case DType::f32:
        return grads_f32[i + misalign];
      case DType::bf16:
        return bf16_to_float(grads_low[i + misalign]);
      case DType::f16:
        return f16_to_float(grads_low[i + misalign]);
    }
    return 0.0f;
  }
  AdamArrays adam(void* low = nullptr, DType low_dtype = DType::bf16) {
    return AdamArrays{count, p(), g(), grad_dtype, m(), v(), low, low_dtype};
  }
  SgdArrays sgd(void* low = nullptr, DType low_dtype = DType::bf16) {
    return SgdArrays{count, p(), g(), grad_dtype, m(), low, low_dtype};
  }

  std::size_t count;
  DType grad_dtype;
  std::size_t misalign;
  std::vector<float> params, exp_avg, exp_avg_sq, grads_f32;
  std::vector<std::uint16_t> grads_low;
};

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
        << what << " differs at " << i << ": " << a[i] << " vs " << b[i];
  }
}

AdamConfig adam_config(bool adamw, std::int64_t step) {
  AdamConfig config;
  config.lr = 1e-3;
  config.weight_decay = adamw ? 0.01 : 0.02;
  config.decoupled_weight_decay = adamw;
  config.step = step;
  config.grad_scale = 0.5f;
  return config;
}

std::string isa_test_name(Isa isa) { return isa_name(isa); }

// --- Each ISA against the scalar variant, bit for bit ---

using VariantParam = std::tuple<Isa, DType /*grads*/, bool /*low params*/>;
class KernelVariant : public ::testing::TestWithParam<VariantParam> {
 protected:
  void SetUp() override {
    if (!isa_supported(isa())) GTEST_SKIP() << isa_name(isa()) << ": not supported by this CPU";
  }
  Isa isa() const { return std::get<0>(GetParam()); }
  DType grad_dtype() const { return std::get<1>(GetParam()); }
  bool low_params() const { return std::get<2>(GetParam()); }
};

const std::size_t kOddLengths[] = {0, 1, 3, 7, 8, 15, 16, 17, 31, 33, 100, 1000, 4099};

TEST_P(KernelVariant, AdamMatchesScalarBitForBit) {
  for (bool adamw : {false, true}) {
    for (bool by_lerp : {false, true}) {
      for (std::size_t count : kOddLengths) {
        for (std::size_t misalign : {0, 1, 3}) {
          TestArrays tested(count, grad_dtype(), misalign, count * 7 + misalign);
          TestArrays reference(count, grad_dtype(), misalign, count * 7 + misalign);
          std::vector<std::uint16_t> tested_low(count + 1), reference_low(count + 1);
          const DType low_dtype = grad_dtype() == DType::f16 ? DType::f16 : DType::bf16;
          for (std::int64_t step = 1; step <= 3; ++step) {
            AdamConfig config = adam_config(adamw, step);
            config.first_moment_by_lerp = by_lerp;
            adam_step(tested.adam(low_params() ? tested_low.data() + 1 : nullptr, low_dtype),
                      config, {isa(), 1});
            adam_step(reference.adam(low_params() ? reference_low.data() + 1 : nullptr, low_dtype),
                      config, {Isa::scalar, 1});
          }
          SCOPED_TRACE(testing::Message()
                       << "count " << count << " misalign " << misalign
                       << (adamw ? " adamw" : " adam") << (by_lerp ? " lerp" : ""));
          expect_same_bits(tested.params, reference.params, "params");
          expect_same_bits(tested.exp_avg, reference.exp_avg, "exp_avg");
          expect_same_bits(tested.exp_avg_sq, reference.exp_avg_sq, "exp_avg_sq");
          EXPECT_EQ(tested_low, reference_low);
          if (low_params()) {
            for (std::size_t i = 0; i < count; ++i) {
              const std::uint16_t expected = low_dtype == DType::f16 ? float_to_f16(tested.p()[i])
                                                                     : float_to_bf16(tested.p()[i]);
              ASSERT_EQ(tested_low[i + 1], expected) << "low params at " << i;
            }
          }
        }
      }
    }
  }
}

// A correctly rounded sqrt passed as AdamConfig::sqrt: the blocked path must
// give the fused path's bits, and see every element exactly once, in blocks of
// at most kSqrtBlock.
std::atomic<std::size_t> sqrt_function_elements{0};
std::atomic<std::size_t> sqrt_function_largest_call{0};
void counting_sqrt(const float* in, float* out, std::size_t count) {
  sqrt_function_elements += count;
  std::size_t largest = sqrt_function_largest_call.load();
  while (count > largest && !sqrt_function_largest_call.compare_exchange_weak(largest, count)) {
  }
  for (std::size_t i = 0; i < count; ++i) out[i] = std::sqrt(in[i]);
}

TEST_P(KernelVariant, AdamWithSqrtFunctionMatchesFusedPath) {
  std::vector<std::size_t> lengths(std::begin(kOddLengths), std::end(kOddLengths));
  lengths.insert(lengths.end(), {kSqrtBlock, kSqrtBlock + 1, 3 * kSqrtBlock + 5, 300007});
  for (bool adamw : {false, true}) {
    for (std::size_t count : lengths) {
      for (int threads : {1, 3}) {
        TestArrays tested(count, grad_dtype(), 1, count * 5 + 1);
        TestArrays reference(count, grad_dtype(), 1, count * 5 + 1);
        std::vector<std::uint16_t> tested_low(count), reference_low(count);
        const DType low_dtype = grad_dtype() == DType::f16 ? DType::f16 : DType::bf16;
        sqrt_function_elements = 0;
        sqrt_function_largest_call = 0;
        for (std::int64_t step = 1; step <= 2; ++step) {
          AdamConfig with_function = adam_config(adamw, step);
          with_function.sqrt = &counting_sqrt;
          adam_step(tested.adam(low_params() ? tested_low.data() : nullptr, low_dtype),
                    with_function, {isa(), threads});
          adam_step(reference.adam(low_params() ? reference_low.data() : nullptr, low_dtype),
                    adam_config(adamw, step), {isa(), threads});
        }
        SCOPED_TRACE(testing::Message() << "count " << count << " threads " << threads
                                        << (adamw ? " adamw" : " adam"));
        EXPECT_EQ(sqrt_function_elements.load(), 2 * count);
        EXPECT_LE(sqrt_function_largest_call.load(), kSqrtBlock);
        expect_same_bits(tested.params, reference.params, "params");
        expect_same_bits(tested.exp_avg, reference.exp_avg, "exp_avg");
        expect_same_bits(tested.exp_avg_sq, reference.exp_avg_sq, "exp_avg_sq");
        EXPECT_EQ(tested_low, reference_low);
      }
    }
  }
}

TEST_P(KernelVariant, SgdMatchesScalarBitForBit) {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case& c : {Case{0, 0, 0, false}, Case{0.9, 0, 0, false}, Case{0.9, 0.1, 1e-4, false},
                        Case{0.9, 0, 1e-4, true}, Case{0, 0, 1e-2, false}}) {
    for (std::size_t count : kOddLengths) {
      TestArrays tested(count, grad_dtype(), 1, count);
      TestArrays reference(count, grad_dtype(), 1, count);
      std::vector<std::uint16_t> tested_low(count), reference_low(count);
      for (int step = 1; step <= 3; ++step) {
        SgdConfig config{0.05,           c.momentum, c.dampening, c.nesterov,
                         c.weight_decay, step == 1,  0.25f};
        sgd_step(tested.sgd(low_params() ? tested_low.data() : nullptr), config, {isa(), 1});
        sgd_step(reference.sgd(low_params() ? reference_low.data() : nullptr), config,
                 {Isa::scalar, 1});
      }
      SCOPED_TRACE(testing::Message() << "count " << count << " momentum " << c.momentum
                                      << " nesterov " << c.nesterov);
      expect_same_bits(tested.params, reference.params, "params");
      expect_same_bits(tested.exp_avg, reference.exp_avg, "momentum buffer");
      EXPECT_EQ(tested_low, reference_low);
    }
  }
}

TEST_P(KernelVariant, GradStatsMatchDoubleReference) {
  for (std::size_t count :
       {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4099}, std::size_t{300001}}) {
    TestArrays arrays(count, grad_dtype(), 1, count);
    double expected = 0.0;
    for (std::size_t i = 0; i < count; ++i) {
      expected += double{arrays.grad_value(i)} * double{arrays.grad_value(i)};
    }
    const GradStats stats = grad_stats(arrays.g(), grad_dtype(), count, {isa(), 2});
    EXPECT_FALSE(stats.found_inf);
    EXPECT_NEAR(stats.sum_squares, expected, 1e-12 * expected) << "count " << count;
  }
}

TEST_P(KernelVariant, FindsInfAndNanAnywhere) {
  const std::size_t count = 300001;  // several reduction blocks, two threads
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::nanf("")};
  TestArrays arrays(count, grad_dtype(), 1, 9);
  for (float special : specials) {
    for (std::size_t position : {std::size_t{0}, std::size_t{77}, count / 2, count - 1}) {
      const float saved = arrays.grads_f32[position + 1];
      const std::uint16_t saved_low = arrays.grads_low[position + 1];
      arrays.grads_f32[position + 1] = special;
      arrays.grads_low[position + 1] =
          grad_dtype() == DType::f16 ? float_to_f16(special) : float_to_bf16(special);
      EXPECT_TRUE(grads_have_inf_or_nan(arrays.g(), grad_dtype(), count, {isa(), 2}))
          << special << " at " << position;
      arrays.grads_f32[position + 1] = saved;
      arrays.grads_low[position + 1] = saved_low;
    }
  }
  // Finite gradients are not flagged; a value too large for fp16 becomes inf
  // there (the overflow dynamic loss scaling looks for).
  TestArrays finite(1000, grad_dtype(), 0, 5);
  EXPECT_FALSE(grads_have_inf_or_nan(finite.g(), grad_dtype(), 1000, {isa(), 1}));
  if (grad_dtype() == DType::f16) {
    std::vector<float> large(33, 1.0f);
    large[32] = 1e5f;
    std::vector<std::uint16_t> half(large.size());
    convert_from_float(large.data(), half.data(), DType::f16, large.size(), {isa(), 1});
    EXPECT_TRUE(grads_have_inf_or_nan(half.data(), DType::f16, half.size(), {isa(), 1}));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, KernelVariant,
                         ::testing::Combine(::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return isa_test_name(std::get<0>(info.param)) + "_grads_" +
                                  dtype_name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_lowparams" : "_f32params");
                         });

// --- Against a straightforward double-precision computation ---

class KernelIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam())) GTEST_SKIP() << isa_name(GetParam()) << ": not supported";
  }
};

TEST_P(KernelIsa, AdamMatchesDoubleReferenceForOneStep) {
  for (bool adamw : {false, true}) {
    for (std::int64_t step : {1, 2, 10, 1000}) {
      const std::size_t count = 10007;
      TestArrays arrays(count, DType::f32, 0, static_cast<std::uint64_t>(step));
      const std::vector<float> p0 = arrays.params, m0 = arrays.exp_avg, v0 = arrays.exp_avg_sq;
      const AdamConfig config = adam_config(adamw, step);
      adam_step(arrays.adam(), config, {GetParam(), 2});
      const double bias_correction1 = 1 - std::pow(config.beta1, step);
      const double bias_correction2 = 1 - std::pow(config.beta2, step);
      for (std::size_t i = 0; i < count; ++i) {
        double p = p0[i];
        double g = double{arrays.grads_f32[i]} * config.grad_scale;
        if (adamw) {
          p *= 1 - config.lr * config.weight_decay;
        } else {
          g += config.weight_decay * p;
        }
        const double m = config.beta1 * m0[i] + (1 - config.beta1) * g;
        const double v = config.beta2 * v0[i] + (1 - config.beta2) * g * g;
        const double update =
            config.lr / bias_correction1 * m / (std::sqrt(v / bias_correction2) + config.eps);
        const double p_new = p - update;
        // A few roundings of each term (and of torch's float scalars).
        ASSERT_NEAR(arrays.params[i], p_new, 4 * kFloatEpsilon * (std::fabs(p) + std::fabs(update)))
            << "param " << i << " step " << step;
        ASSERT_NEAR(arrays.exp_avg[i], m,
                    4 * kFloatEpsilon * (config.beta1 * std::fabs(m0[i]) + std::fabs(g)));
        ASSERT_NEAR(arrays.exp_avg_sq[i], v, 4 * kFloatEpsilon * (v0[i] + g * g));
      }
    }
  }
}

TEST_P(KernelIsa, SgdMatchesDoubleReference) {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case& c :
       {Case{0, 0, 0, false}, Case{0.9, 0.1, 1e-2, false}, Case{0.9, 0, 1e-2, true}}) {
    const std::size_t count = 4099;
    TestArrays arrays(count, DType::f32, 0, 11);
    std::vector<double> p(arrays.params.begin(), arrays.params.end());
    std::vector<double> buffer(count, 0.0);
    for (int step = 1; step <= 5; ++step) {
      const SgdConfig config{0.05, c.momentum, c.dampening, c.nesterov, c.weight_decay, step == 1};
      sgd_step(arrays.sgd(), config, {GetParam(), 2});
      for (std::size_t i = 0; i < count; ++i) {
        double d = double{arrays.grads_f32[i]} + c.weight_decay * p[i];
        if (c.momentum != 0) {
          buffer[i] = step == 1 ? d : c.momentum * buffer[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buffer[i] : buffer[i];
        }
        p[i] -= 0.05 * d;
      }
    }
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_NEAR(arrays.params[i], p[i], 1e-6 * (std::fabs(p[i]) + 1)) << "param " << i;
    }
  }
}

TEST_P(KernelIsa, ThreadsGiveTheSameBitsAsOneThread) {
  const std::size_t count = (std::size_t{1} << 20) + 13;
  for (int threads : {0, 2, 3, 5, 7}) {
    TestArrays one(count, DType::bf16, 1, 42), many(count, DType::bf16, 1, 42);
    std::vector<std::uint16_t> one_low(count), many_low(count);
    for (std::int64_t step = 1; step <= 2; ++step) {
      adam_step(one.adam(one_low.data()), adam_config(true, step), {GetParam(), 1});
      adam_step(many.adam(many_low.data()), adam_config(true, step), {GetParam(), threads});
    }
    expect_same_bits(one.params, many.params, "params");
    expect_same_bits(one.exp_avg_sq, many.exp_avg_sq, "exp_avg_sq");
    EXPECT_EQ(one_low, many_low);
    const GradStats single = grad_stats(one.g(), DType::bf16, count, {GetParam(), 1});
    const GradStats parallel = grad_stats(one.g(), DType::bf16, count, {GetParam(), threads});
    EXPECT_EQ(std::memcmp(&single.sum_squares, &parallel.sum_squares, sizeof(double)), 0);
    SgdConfig sgd_config{0.1, 0.9, 0.0, true, 1e-4, true};
    TestArrays sgd_one(count, DType::f32, 0, 3), sgd_many(count, DType::f32, 0, 3);
    sgd_step(sgd_one.sgd(), sgd_config, {GetParam(), 1});
    sgd_step(sgd_many.sgd(), sgd_config, {GetParam(), threads});
    expect_same_bits(sgd_one.params, sgd_many.params, "sgd params");
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, KernelIsa, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return isa_test_name(info.param); });

// --- The pool (Note [Kernel threads]) ---

// AdamConfig::sqrt runs inside each range, on the thread running it: a
// correctly rounded one (the fused path's bits) that records those threads
// and the CPUs each may run on shows who ran a call.
struct RangeThreads {
  std::mutex mutex;
  std::set<std::thread::id> ids;
  std::set<int> allowed_cpus;
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    ids.clear();
    allowed_cpus.clear();
  }
};
RangeThreads range_threads;

void recording_sqrt(const float* in, float* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) out[i] = std::sqrt(in[i]);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  sched_getaffinity(0, sizeof(mask), &mask);  // 0: the calling thread
  std::lock_guard<std::mutex> lock(range_threads.mutex);
  range_threads.ids.insert(std::this_thread::get_id());
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) range_threads.allowed_cpus.insert(cpu);
  }
}

TEST(KernelPool, ThreadCountsAndAPinnedCallerGiveTheSameBits) {
  const std::size_t count = 5 * (std::size_t{1} << 16) + 4099;  // up to 5 ranges
  TestArrays reference(count, DType::bf16, 1, 11);
  for (std::int64_t step = 1; step <= 3; ++step) {
    adam_step(reference.adam(), adam_config(true, step), {Isa::automatic, 1});
  }
  const GradStats reference_stats =
      grad_stats(reference.g(), DType::bf16, count, {Isa::automatic, 1});
  struct Case {
    int threads;
    bool pinned;
  };
  // Unpinned first: the pool's threads are created with the process's CPUs.
  for (const Case c : {Case{0, false}, Case{2, false}, Case{5, false}, Case{2, true}, Case{5, true},
                       Case{0, true}}) {
    SCOPED_TRACE(testing::Message() << "threads " << c.threads << (c.pinned ? ", pinned" : ""));
    std::unique_ptr<PinCallingThread> pin;
    if (c.pinned) {
      pin = std::make_unique<PinCallingThread>();
      ASSERT_TRUE(pin->pinned());
    }
    range_threads.clear();
    TestArrays tested(count, DType::bf16, 1, 11);
    for (std::int64_t step = 1; step <= 3; ++step) {
      AdamConfig config = adam_config(true, step);
      config.sqrt = &recording_sqrt;
      adam_step(tested.adam(), config, {Isa::automatic, c.threads});
    }
    expect_same_bits(tested.params, reference.params, "params");
    expect_same_bits(tested.exp_avg, reference.exp_avg, "exp_avg");
    expect_same_bits(tested.exp_avg_sq, reference.exp_avg_sq, "exp_avg_sq");
    const GradStats stats = grad_stats(tested.g(), DType::bf16, count, {Isa::automatic, c.threads});
    EXPECT_EQ(std::memcmp(&stats.sum_squares, &reference_stats.sum_squares, sizeof(double)), 0);
    if (c.pinned && c.threads > 1 && std::string(default_pool_name()) == "openmp") {
      // More than one thread ran the ranges, and not all on the caller's core.
      EXPECT_GT(range_threads.ids.size(), 1u);
      if (pin->cpus_before() > 1) EXPECT_GT(range_threads.allowed_cpus.size(), 1u);
      std::printf("pinned caller, %d threads asked: %zu threads ran, allowed %zu CPUs\n", c.threads,
                  range_threads.ids.size(), range_threads.allowed_cpus.size());
    }
  }
}

// A caller's ParallelFor: one task per range, as many ranges as its
// max_threads when num_threads is 0; order does not matter.
std::atomic<int> reversed_pool_tasks{0};
void reversed_run(int tasks, void* context, TaskFunction task) {
  reversed_pool_tasks += tasks;
  for (int index = tasks - 1; index >= 0; --index) task(context, index);
}

TEST(KernelPool, RunsOnTheCallersParallelFor) {
  const std::size_t count = 5 * (std::size_t{1} << 16) + 4099;
  TestArrays reference(count, DType::f32, 0, 5), tested(count, DType::f32, 0, 5);
  ExecConfig exec;
  exec.parallel_for = {&reversed_run, [] { return 3; }};
  reversed_pool_tasks = 0;
  adam_step(reference.adam(), adam_config(false, 1), {Isa::automatic, 1});
  adam_step(tested.adam(), adam_config(false, 1), exec);
  EXPECT_EQ(reversed_pool_tasks.load(), 3);
  expect_same_bits(tested.params, reference.params, "params");
  exec.num_threads = 5;
  reversed_pool_tasks = 0;
  const GradStats stats = grad_stats(tested.g(), DType::f32, count, exec);
  EXPECT_EQ(reversed_pool_tasks.load(), 5);
  const GradStats one = grad_stats(tested.g(), DType::f32, count, {Isa::automatic, 1});
  EXPECT_EQ(std::memcmp(&stats.sum_squares, &one.sum_squares, sizeof(double)), 0);
}

TEST(KernelDispatch, BestIsaIsSupportedAndNamed) {
  EXPECT_TRUE(isa_supported(best_isa()));
  EXPECT_NE(best_isa(), Isa::automatic);
  std::printf("best CPU optimizer ISA here: %s, default pool %s\n", isa_name(best_isa()),
              default_pool_name());
}

}  // namespace
}  // namespace spillway::optim::cpu
