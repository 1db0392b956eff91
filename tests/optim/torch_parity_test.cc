// spillway's CPU kernels against LibTorch's torch::optim::Adam, AdamW and SGD:
// the same random parameters and gradients, 50 steps, compared after every
// step. Built with NDEBUG (as torch is).
// - Adam with torch's square root (what the torch bridge runs) and SGD:
//   bit-identical parameters every step.
// - Adam with the correctly rounded square root (the kernels' default): the
//   moments are bit-identical (when they do not depend on the parameters) and
//   each parameter stays within the bound that torch's square root explains
//   (Note [Square roots from torch] in hooks/optim/cpu_kernel_loops.inc).
#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "hooks/optim/cpu_kernels.h"
#include "hooks/torch/torch_parallel_for.h"
#include "hooks/torch/torch_sqrt.h"
#include "tests/optim/pin_calling_thread.h"

namespace spillway::optim::cpu {
namespace {

constexpr int kSteps = 50;
// Relative difference |ours - torch| / max(|torch|, kRelativeFloor): the floor
// keeps parameters that pass through ~0 from turning a 1e-12 absolute
// difference into a huge ratio.
constexpr double kRelativeFloor = 1e-3;

struct Difference {
  double max_relative = 0.0;
  double max_absolute = 0.0;
  std::int64_t differing = 0;  // elements not bit-identical
  std::int64_t total = 0;
};

Difference compare(const float* ours, const torch::Tensor& theirs) {
  Difference d;
  const torch::Tensor contiguous = theirs.contiguous();
  const float* reference = contiguous.data_ptr<float>();
  d.total = contiguous.numel();
  for (std::int64_t i = 0; i < d.total; ++i) {
    const double absolute = std::fabs(double{ours[i]} - double{reference[i]});
    d.max_absolute = std::max(d.max_absolute, absolute);
    d.max_relative = std::max(d.max_relative,
                              absolute / std::max(std::fabs(double{reference[i]}), kRelativeFloor));
    d.differing += ours[i] != reference[i];
  }
  return d;
}

// Parameter tensors of mixed sizes (vector tails) with their spillway copies.
struct Model {
  explicit Model(std::uint64_t seed) {
    torch::manual_seed(seed);
    for (std::int64_t size : {std::int64_t{100003}, std::int64_t{4099}, std::int64_t{17}}) {
      torch::Tensor param = torch::randn({size});
      params.push_back(param.clone().set_requires_grad(true));
      ours.emplace_back(param.data_ptr<float>(), param.data_ptr<float>() + size);
      exp_avg.emplace_back(size, 0.0f);
      exp_avg_sq.emplace_back(size, 0.0f);
    }
  }
  // New random gradients for torch's params; returns them for ours.
  std::vector<torch::Tensor> set_gradients() {
    std::vector<torch::Tensor> grads;
    for (torch::Tensor& param : params) {
      torch::Tensor grad = torch::randn_like(param) * 0.1;
      param.mutable_grad() = grad.clone();
      grads.push_back(grad);
    }
    return grads;
  }
  std::vector<torch::Tensor> params;
  std::vector<std::vector<float>> ours, exp_avg, exp_avg_sq;
};

struct AdamCase {
  const char* name;
  bool adamw;
  double lr, weight_decay;
};

enum class SqrtSource { torch, correctly_rounded };

const char* sqrt_source_name(SqrtSource source) {
  return source == SqrtSource::torch ? "TorchSqrt" : "CorrectlyRoundedSqrt";
}

// What a last-bit difference in sqrt(exp_avg_sq) explains: the update's
// denominator, and so the update, moves by at most a few ulps (2^-21 of
// |update| covers the sqrt, the division and the addition of eps), and the
// parameter's own rounding by one ulp of the parameter. These accumulate
// over the steps; AdamW's decay only shrinks them.
struct SqrtDifferenceBound {
  void add_step(const float* before, const float* after, std::size_t count) {
    allowed.resize(count, 0.0);
    for (std::size_t i = 0; i < count; ++i) {
      const float magnitude = std::fabs(after[i]);
      const double ulp = double{std::nextafter(magnitude, INFINITY)} - double{magnitude};
      allowed[i] += std::ldexp(std::fabs(double{after[i]} - double{before[i]}), -21) + ulp;
    }
  }
  std::vector<double> allowed;
};

// torch's exp_avg and exp_avg_sq of `param` (AdamW keeps a state type of its own).
std::pair<torch::Tensor, torch::Tensor> torch_moments(const torch::optim::Optimizer& optimizer,
                                                      bool adamw, const torch::Tensor& param) {
  const torch::optim::OptimizerParamState& state =
      *optimizer.state().at(param.unsafeGetTensorImpl());
  if (adamw) {
    const auto& adamw_state = static_cast<const torch::optim::AdamWParamState&>(state);
    return {adamw_state.exp_avg(), adamw_state.exp_avg_sq()};
  }
  const auto& adam_state = static_cast<const torch::optim::AdamParamState&>(state);
  return {adam_state.exp_avg(), adam_state.exp_avg_sq()};
}

class TorchAdamParity : public ::testing::TestWithParam<std::tuple<AdamCase, Isa, SqrtSource>> {};

TEST_P(TorchAdamParity, MatchesTorchOver50Steps) {
  const AdamCase& c = std::get<0>(GetParam());
  const Isa isa = std::get<1>(GetParam());
  const SqrtSource sqrt_source = std::get<2>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP() << isa_name(isa) << ": not supported by this CPU";
  Model model(7);
  std::unique_ptr<torch::optim::Optimizer> torch_optimizer;
  if (c.adamw) {
    torch_optimizer = std::make_unique<torch::optim::AdamW>(
        model.params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    torch_optimizer = std::make_unique<torch::optim::Adam>(
        model.params, torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  // The moments depend on the parameters only through Adam's L2 term.
  const bool moments_independent_of_params = c.adamw || c.weight_decay == 0.0;
  std::vector<SqrtDifferenceBound> bounds(model.params.size());
  Difference worst;
  std::int64_t bit_identical_steps = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<torch::Tensor> grads = model.set_gradients();
    std::vector<torch::Tensor> before;
    for (const torch::Tensor& param : model.params) before.push_back(param.detach().clone());
    torch_optimizer->step();
    AdamConfig config;
    config.lr = c.lr;
    config.weight_decay = c.weight_decay;
    config.decoupled_weight_decay = c.adamw;
    config.step = step;
    if (sqrt_source == SqrtSource::torch) config.sqrt = &torch_sqrt;
    Difference this_step;
    for (std::size_t t = 0; t < model.params.size(); ++t) {
      const AdamArrays arrays{model.ours[t].size(),       model.ours[t].data(),
                              grads[t].data_ptr<float>(), DType::f32,
                              model.exp_avg[t].data(),    model.exp_avg_sq[t].data()};
      adam_step(arrays, config, {isa, 0});
      const torch::Tensor theirs = model.params[t].detach();
      const Difference d = compare(model.ours[t].data(), theirs);
      this_step.max_relative = std::max(this_step.max_relative, d.max_relative);
      this_step.max_absolute = std::max(this_step.max_absolute, d.max_absolute);
      this_step.differing += d.differing;
      this_step.total += d.total;
      if (sqrt_source == SqrtSource::correctly_rounded) {
        bounds[t].add_step(before[t].data_ptr<float>(), theirs.data_ptr<float>(),
                           model.ours[t].size());
        const float* reference = theirs.data_ptr<float>();
        std::int64_t outside = 0;
        for (std::size_t i = 0; i < model.ours[t].size(); ++i) {
          outside +=
              std::fabs(double{model.ours[t][i]} - double{reference[i]}) > bounds[t].allowed[i];
        }
        EXPECT_EQ(outside, 0) << "step " << step << ", tensor " << t
                              << ": elements beyond what torch's square root explains";
        if (moments_independent_of_params) {
          const auto [exp_avg, exp_avg_sq] =
              torch_moments(*torch_optimizer, c.adamw, model.params[t]);
          EXPECT_EQ(compare(model.exp_avg[t].data(), exp_avg).differing, 0) << "step " << step;
          EXPECT_EQ(compare(model.exp_avg_sq[t].data(), exp_avg_sq).differing, 0)
              << "step " << step;
        }
      }
    }
    if (sqrt_source == SqrtSource::torch) EXPECT_EQ(this_step.differing, 0) << "step " << step;
    bit_identical_steps += this_step.differing == 0;
    worst.max_relative = std::max(worst.max_relative, this_step.max_relative);
    worst.max_absolute = std::max(worst.max_absolute, this_step.max_absolute);
    worst.differing = std::max(worst.differing, this_step.differing);
    worst.total = this_step.total;
  }
  std::printf(
      "%s vs torch (ISA %s, %s, %d steps, %lld params): max relative param difference %.3g "
      "(floor %.0e), max absolute %.3g, worst step %lld elements not bit-identical, "
      "%lld/%d steps bit-identical\n",
      c.name, isa_name(isa), sqrt_source_name(sqrt_source), kSteps,
      static_cast<long long>(worst.total), worst.max_relative, kRelativeFloor, worst.max_absolute,
      static_cast<long long>(worst.differing), static_cast<long long>(bit_identical_steps), kSteps);
  RecordProperty("max_relative_difference", std::to_string(worst.max_relative));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TorchAdamParity,
    ::testing::Combine(::testing::Values(AdamCase{"Adam", false, 1e-3, 0.0},
                                         AdamCase{"AdamL2", false, 1e-3, 1e-2},
                                         AdamCase{"AdamW", true, 1e-3, 1e-2},
                                         AdamCase{"AdamWLargeLr", true, 1e-1, 1e-1}),
                       ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                       ::testing::Values(SqrtSource::torch, SqrtSource::correctly_rounded)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_" + isa_name(std::get<1>(info.param)) +
             "_" + sqrt_source_name(std::get<2>(info.param));
    });

// --- The same bits at any thread count, on either pool, pinned or not ---

// torch's square root, recording the threads that ran the ranges (it is
// called inside each range, on the thread running it).
std::mutex range_threads_mutex;
std::set<std::thread::id> range_threads;
void recording_torch_sqrt(const float* in, float* out, std::size_t count) {
  torch_sqrt(in, out, count);
  std::lock_guard<std::mutex> lock(range_threads_mutex);
  range_threads.insert(std::this_thread::get_id());
}

class TorchAdamParityAcrossThreads : public ::testing::TestWithParam<AdamCase> {};

TEST_P(TorchAdamParityAcrossThreads, BitIdenticalOnEveryPoolAndThreadCount) {
  const AdamCase& c = GetParam();
  constexpr std::int64_t kCount = 5 * (std::int64_t{1} << 16) + 4099;  // up to 5 ranges
  constexpr int kParitySteps = 10;
  struct Run {
    const char* name;
    ExecConfig exec;
    bool pinned;
    std::vector<float> params, exp_avg, exp_avg_sq;
  };
  ExecConfig on_torch = torch_exec_config();
  ExecConfig on_torch_5 = on_torch;
  on_torch_5.num_threads = 5;
  // Unpinned first: the pools' threads are created with the process's CPUs.
  std::vector<Run> runs{{"default pool, 1 thread", {Isa::automatic, 1}, false},
                        {"default pool, 2 threads", {Isa::automatic, 2}, false},
                        {"default pool, 5 threads", {Isa::automatic, 5}, false},
                        {"default pool, all threads", {Isa::automatic, 0}, false},
                        {"torch pool, all threads", on_torch, false},
                        {"torch pool, 5 ranges", on_torch_5, false},
                        {"default pool, 5 threads, caller pinned", {Isa::automatic, 5}, true},
                        {"torch pool, 5 ranges, caller pinned", on_torch_5, true}};
  torch::manual_seed(3);
  torch::Tensor param = torch::randn({kCount});
  for (Run& run : runs) {
    run.params.assign(param.data_ptr<float>(), param.data_ptr<float>() + kCount);
    run.exp_avg.assign(kCount, 0.0f);
    run.exp_avg_sq.assign(kCount, 0.0f);
  }
  param.set_requires_grad(true);
  std::unique_ptr<torch::optim::Optimizer> torch_optimizer;
  if (c.adamw) {
    torch_optimizer = std::make_unique<torch::optim::AdamW>(
        std::vector<torch::Tensor>{param},
        torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  } else {
    torch_optimizer = std::make_unique<torch::optim::Adam>(
        std::vector<torch::Tensor>{param},
        torch::optim::AdamOptions(c.lr).weight_decay(c.weight_decay));
  }
  for (int step = 1; step <= kParitySteps; ++step) {
    const torch::Tensor grad = torch::randn({kCount}) * 0.1;
    param.mutable_grad() = grad.clone();
    torch_optimizer->step();
    AdamConfig config;
    config.lr = c.lr;
    config.weight_decay = c.weight_decay;
    config.decoupled_weight_decay = c.adamw;
    config.step = step;
    config.sqrt = &recording_torch_sqrt;
    for (Run& run : runs) {
      SCOPED_TRACE(testing::Message() << run.name << ", step " << step);
      std::unique_ptr<PinCallingThread> pin;
      if (run.pinned) {
        pin = std::make_unique<PinCallingThread>();
        ASSERT_TRUE(pin->pinned());
      }
      range_threads.clear();
      adam_step({static_cast<std::size_t>(kCount), run.params.data(), grad.data_ptr<float>(),
                 DType::f32, run.exp_avg.data(), run.exp_avg_sq.data()},
                config, run.exec);
      pin.reset();
      const std::int64_t differing = compare(run.params.data(), param.detach()).differing;
      EXPECT_EQ(differing, 0);
      const bool pool_has_threads = run.exec.parallel_for.run != nullptr
                                        ? at::get_num_threads() > 1
                                        : std::string(default_pool_name()) == "openmp";
      if (run.pinned && pool_has_threads) {
        EXPECT_GT(range_threads.size(), 1u) << "a pinned caller ran every range itself";
      }
      if (step == kParitySteps) {
        std::printf("%s, %s: %lld elements differ from torch, last step on %zu threads\n", c.name,
                    run.name, static_cast<long long>(differing), range_threads.size());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchAdamParityAcrossThreads,
                         ::testing::Values(AdamCase{"AdamL2", false, 1e-3, 1e-2},
                                           AdamCase{"AdamW", true, 1e-3, 1e-2}),
                         [](const auto& info) { return std::string(info.param.name); });

// torch.optim.Adam / AdamW (Python, torch 2.x) as tensor ops: _single_tensor_adam
// updates exp_avg with lerp_. With first_moment_by_lerp and torch's square
// root the kernels match it bit for bit.
class TorchPythonAdamParity : public ::testing::TestWithParam<std::tuple<AdamCase, Isa>> {};

TEST_P(TorchPythonAdamParity, BitIdenticalOver50Steps) {
  const AdamCase& c = std::get<0>(GetParam());
  const Isa isa = std::get<1>(GetParam());
  if (!isa_supported(isa)) GTEST_SKIP() << isa_name(isa) << ": not supported by this CPU";
  torch::NoGradGuard no_grad;
  Model model(13);
  std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  for (const torch::Tensor& param : model.params) {
    exp_avg.push_back(torch::zeros_like(param));
    exp_avg_sq.push_back(torch::zeros_like(param));
  }
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::int64_t differing = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<torch::Tensor> grads = model.set_gradients();
    const double bias_correction1 = 1 - std::pow(beta1, step);
    const double bias_correction2 = 1 - std::pow(beta2, step);
    AdamConfig config;
    config.lr = c.lr;
    config.weight_decay = c.weight_decay;
    config.decoupled_weight_decay = c.adamw;
    config.step = step;
    config.first_moment_by_lerp = true;
    config.sqrt = &torch_sqrt;
    for (std::size_t t = 0; t < model.params.size(); ++t) {
      torch::Tensor param = model.params[t].detach();
      torch::Tensor grad = grads[t];
      if (c.adamw) {
        param.mul_(1 - c.lr * c.weight_decay);
      } else if (c.weight_decay != 0) {
        grad = grad.add(param, c.weight_decay);
      }
      exp_avg[t].lerp_(grad, 1 - beta1);
      exp_avg_sq[t].mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      const torch::Tensor denom = (exp_avg_sq[t].sqrt() / std::sqrt(bias_correction2)).add_(eps);
      param.addcdiv_(exp_avg[t], denom, -(c.lr / bias_correction1));

      const AdamArrays arrays{model.ours[t].size(),       model.ours[t].data(),
                              grads[t].data_ptr<float>(), DType::f32,
                              model.exp_avg[t].data(),    model.exp_avg_sq[t].data()};
      adam_step(arrays, config, {isa, 0});
      differing += compare(model.ours[t].data(), param).differing;
      differing += compare(model.exp_avg[t].data(), exp_avg[t]).differing;
    }
  }
  std::printf("%s vs torch.optim's formula (ISA %s, %d steps): %lld elements not bit-identical\n",
              c.name, isa_name(isa), kSteps, static_cast<long long>(differing));
  EXPECT_EQ(differing, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TorchPythonAdamParity,
    ::testing::Combine(::testing::Values(AdamCase{"Adam", false, 1e-3, 0.0},
                                         AdamCase{"AdamL2", false, 1e-3, 1e-2},
                                         AdamCase{"AdamWLargeLr", true, 1e-1, 1e-1}),
                       ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + "_" + isa_name(std::get<1>(info.param));
    });

struct SgdCase {
  const char* name;
  double momentum, dampening, weight_decay;
  bool nesterov;
};

class TorchSgdParity : public ::testing::TestWithParam<SgdCase> {};

TEST_P(TorchSgdParity, BitIdenticalOver50Steps) {
  const SgdCase& c = GetParam();
  Model model(11);
  torch::optim::SGD torch_optimizer(model.params, torch::optim::SGDOptions(0.05)
                                                      .momentum(c.momentum)
                                                      .dampening(c.dampening)
                                                      .weight_decay(c.weight_decay)
                                                      .nesterov(c.nesterov));
  Difference worst;
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<torch::Tensor> grads = model.set_gradients();
    torch_optimizer.step();
    const SgdConfig config{0.05, c.momentum, c.dampening, c.nesterov, c.weight_decay, step == 1};
    for (std::size_t t = 0; t < model.params.size(); ++t) {
      const SgdArrays arrays{model.ours[t].size(), model.ours[t].data(), grads[t].data_ptr<float>(),
                             DType::f32, model.exp_avg[t].data()};
      sgd_step(arrays, config);
      const Difference d = compare(model.ours[t].data(), model.params[t].detach());
      worst.max_relative = std::max(worst.max_relative, d.max_relative);
      worst.max_absolute = std::max(worst.max_absolute, d.max_absolute);
      worst.differing = std::max(worst.differing, d.differing);
    }
  }
  std::printf(
      "SGD %s vs torch (%d steps): max relative %.3g, max absolute %.3g, worst tensor %lld "
      "elements not bit-identical\n",
      c.name, kSteps, worst.max_relative, worst.max_absolute,
      static_cast<long long>(worst.differing));
  EXPECT_EQ(worst.differing, 0);
  EXPECT_LE(worst.max_relative, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchSgdParity,
                         ::testing::Values(SgdCase{"Plain", 0, 0, 0, false},
                                           SgdCase{"Momentum", 0.9, 0, 0, false},
                                           SgdCase{"MomentumDampening", 0.9, 0.1, 1e-4, false},
                                           SgdCase{"Nesterov", 0.9, 0, 1e-4, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace spillway::optim::cpu
