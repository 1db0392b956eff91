// spillway's chunked optimizers (hooks/torch/optim.h) against torch::optim on
// the same model and data, with their state in chunks that a small device
// budget moves out and back every step (sim device, strict_residency). Prints
// the measured differences; asserts the bounds.
//
// SPILLWAY_OPTIM_TEST_BUDGET overrides the 6 MiB device budget: ctest runs
// the suite twice, at 6 MiB (most updates fall back to the host: a step's
// param, grad and two state chunks do not fit in three) and at 12 MiB (most
// run on the device), so both paths of Note [Where an update runs] are tested.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "allocator/runtime.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

namespace {

constexpr int kBatch = 16;
constexpr int kInputs = 128;
constexpr int kWidth = 512;
constexpr int kOutputs = 16;
// Relative differences are taken against max(|reference|, kFloor), so that
// parameters passing through zero do not turn 1e-12 into a large ratio (as in
// tests/optim/torch_parity_test.cc).
constexpr double kFloor = 1e-3;

const char* budget_override() { return std::getenv("SPILLWAY_OPTIM_TEST_BUDGET"); }

// On the sim device the budget also holds what torch allocates (Note [torch's
// CPU allocator on the sim device]): here the reference runs' gradients, and
// the gradient autograd makes after a set-to-none zero_grad (the default)
// until it goes into its chunk (Note [Binding right after accumulation] in
// grad_binding.cc). The allocator's budget is the configured one (the room
// for chunks the two runs are about) plus kGradientRoomBytes for them.
constexpr std::size_t kGradientRoomBytes = std::size_t{6} << 20;  // the MLP's 4.3 MiB, in slabs

void configure_spillway() {
  const char* budget = budget_override();
  spillway::configure(std::string("device:sim,strict_residency:true,chunk_size:2MiB,") +
                      "device_budget:" + (budget != nullptr ? budget : "6MiB") +
                      ",sim_capacity:256MiB,policy:lru");
  static std::once_flag widened;
  std::call_once(widened, [] {
    spillway::activate();
    spillway::CachingAllocator* allocator = spillway::Runtime::process().active_allocator();
    allocator->set_budget_bytes(allocator->budget_bytes() + kGradientRoomBytes);
  });
}

// The reference (plain torch::optim) works on torch's own memory: on the sim
// device spillway is torch's CPU allocator, and the reference's gradients and
// state would otherwise share the budget with the optimizer under test, which
// is sized for the latter (Note [torch's CPU allocator on the sim device]).
template <typename Work>
auto reference_work(Work work) {
  spillway::torch_bridge::HostWorkScope host;
  return work();
}

nlohmann::json stats() { return nlohmann::json::parse(spillway::memory_stats_json()); }

std::uint64_t stat(const std::string& key) {
  const nlohmann::json json = stats();
  return json.contains(key) ? json.at(key).get<std::uint64_t>() : 0;
}

torch::nn::Sequential make_mlp(std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(
      torch::nn::Linear(kInputs, kWidth), torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth),
      torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(),
      torch::nn::Linear(kWidth, kWidth), torch::nn::ReLU(), torch::nn::Linear(kWidth, kWidth),
      torch::nn::Tanh(), torch::nn::Linear(kWidth, kOutputs));
}

// Max over all elements of |ours - theirs| / max(|theirs|, kFloor).
double max_relative_difference(const std::vector<torch::Tensor>& ours,
                               const std::vector<torch::Tensor>& theirs) {
  spillway::torch_bridge::HostWorkScope host;  // the check's temporaries: off the budget
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const torch::Tensor a = ours[i].detach().to(torch::kDouble);
    const torch::Tensor b = theirs[i].detach().to(torch::kDouble);
    worst = std::max(worst, ((a - b).abs() / b.abs().clamp_min(kFloor)).max().item<double>());
  }
  return worst;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  spillway::torch_bridge::HostWorkScope host;  // the check's temporaries: off the budget
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i].detach(), b[i].detach())) return false;
  return true;
}

void backward_on(torch::nn::Sequential& model, const torch::Tensor& x, const torch::Tensor& y,
                 double loss_factor = 1.0) {
  (torch::mse_loss(model->forward(x), y) * loss_factor).backward();
}

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

struct ParityCase {
  const char* name;
  OptimizerFactory torch_optimizer;
  OptimizerFactory spillway_optimizer;
};

void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.name; }

class ChunkedOptimizerParity : public ::testing::TestWithParam<ParityCase> {};

// 50 steps on the same MLP and data: after every step the parameters are
// within 1e-6 relative of torch's; the state is in the optimizer's chunks and
// chunks moved.
TEST_P(ChunkedOptimizerParity, MatchesTorchOver50Steps) {
  constexpr int kSteps = 50;
  torch::set_num_threads(1);
  configure_spillway();
  torch::nn::Sequential reference = reference_work([] { return make_mlp(0); });
  torch::nn::Sequential model = make_mlp(0);
  auto torch_optimizer = GetParam().torch_optimizer(reference->parameters());
  auto optimizer = GetParam().spillway_optimizer(model->parameters());
  auto& chunked = dynamic_cast<spillway::optim::ChunkedOptimizer&>(*optimizer);
  torch::manual_seed(1);
  const torch::Tensor inputs = torch::randn({kSteps, kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kBatch, kOutputs});
  const std::uint64_t evictions_before = stat("evictions");

  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    reference_work([&] { torch_optimizer->zero_grad(); });
    optimizer->zero_grad();
    reference_work([&] { backward_on(reference, inputs[step], targets[step]); });
    backward_on(model, inputs[step], targets[step]);
    reference_work([&] { torch_optimizer->step(); });
    optimizer->step();
    const double difference = max_relative_difference(model->parameters(), reference->parameters());
    EXPECT_LE(difference, 1e-6) << "step " << step;
    worst = std::max(worst, difference);
  }
  const spillway::optim::UpdatePlacement placement = chunked.placement();
  std::printf(
      "%s vs torch, %d steps: max relative parameter difference %.3g (floor %.0e); updates on "
      "the host %lld, on the device %lld\n",
      GetParam().name, kSteps, worst, kFloor, static_cast<long long>(placement.host),
      static_cast<long long>(placement.device));
  RecordProperty("max_relative_difference", std::to_string(worst));

  const std::int64_t tensors = static_cast<std::int64_t>(model->parameters().size());
  EXPECT_EQ(placement.host + placement.device, tensors * kSteps);
  if (budget_override() != nullptr) EXPECT_GT(placement.device, 0);
  // Back-to-back parameters share a kernel call (Note [One kernel call per run]).
  std::printf("%s: %lld kernel calls for %lld parameter updates\n", GetParam().name,
              static_cast<long long>(placement.kernel_calls),
              static_cast<long long>(placement.host + placement.device));
  EXPECT_LT(placement.kernel_calls, placement.host + placement.device);

  // The state is the optimizer client's, in chunks; chunks moved under the budget.
  const nlohmann::json clients = stats().at("clients");
  ASSERT_TRUE(clients.contains(chunked.client_name())) << clients.dump();
  const nlohmann::json& mine = clients.at(chunked.client_name());
  std::int64_t param_bytes = 0;
  for (const torch::Tensor& param : model->parameters()) param_bytes += param.numel() * 4;
  const int state_arrays = std::string(GetParam().name).rfind("SGD", 0) == 0 ? 1 : 2;
  EXPECT_GE(mine.at("chunk_bytes.device").get<std::int64_t>() +
                mine.at("chunk_bytes.host").get<std::int64_t>(),
            state_arrays * param_bytes)
      << mine.dump();
  EXPECT_GT(stat("evictions"), evictions_before);
  std::printf("%s: clients %s\n", GetParam().name, clients.dump().c_str());
}

template <class TorchOptimizer, class SpillwayOptimizer, class Options>
ParityCase parity_case(const char* name, Options options) {
  return {name,
          [options](std::vector<torch::Tensor> params) {
            return std::make_unique<TorchOptimizer>(std::move(params), options);
          },
          [options](std::vector<torch::Tensor> params) {
            return std::make_unique<SpillwayOptimizer>(std::move(params), options);
          }};
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ChunkedOptimizerParity,
    ::testing::Values(
        parity_case<torch::optim::Adam, spillway::optim::Adam>("Adam",
                                                               torch::optim::AdamOptions(1e-3)),
        parity_case<torch::optim::Adam, spillway::optim::Adam>(
            "AdamL2", torch::optim::AdamOptions(1e-3).weight_decay(1e-2)),
        parity_case<torch::optim::AdamW, spillway::optim::AdamW>(
            "AdamW", torch::optim::AdamWOptions(1e-3).weight_decay(1e-2)),
        parity_case<torch::optim::SGD, spillway::optim::SGD>(
            "SGDNesterov",
            torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(1e-4))),
    [](const auto& info) { return std::string(info.param.name); });

// Two groups with different learning rates, one changed midway; then a
// save / load round trip into a fresh optimizer over a copy of the model
// continues bit-identically.
TEST(ChunkedOptimizer, ParameterGroupsAndSaveLoadRoundTrip) {
  torch::set_num_threads(1);
  configure_spillway();
  auto groups_of = [](torch::nn::Sequential& model) {
    std::vector<torch::Tensor> params = model->parameters();
    const std::size_t half = params.size() / 2;
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + half),
                        std::make_unique<torch::optim::AdamOptions>(1e-3));
    groups.emplace_back(std::vector<torch::Tensor>(params.begin() + half, params.end()),
                        std::make_unique<torch::optim::AdamOptions>(1e-2));
    return groups;
  };
  torch::nn::Sequential reference = reference_work([] { return make_mlp(3); });
  torch::nn::Sequential model = make_mlp(3);
  torch::optim::Adam torch_adam(groups_of(reference), torch::optim::AdamOptions(1e-3));
  spillway::optim::Adam adam(groups_of(model), torch::optim::AdamOptions(1e-3));
  ASSERT_EQ(adam.param_groups().size(), 2u);
  torch::manual_seed(4);
  constexpr int kSteps = 12;
  const torch::Tensor inputs = torch::randn({kSteps, kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kBatch, kOutputs});

  double worst = 0;
  auto train_step = [&](int step) {
    if (step == 3) {  // options changed between steps take effect
      static_cast<torch::optim::AdamOptions&>(torch_adam.param_groups()[1].options()).lr(3e-3);
      static_cast<torch::optim::AdamOptions&>(adam.param_groups()[1].options()).lr(3e-3);
    }
    reference_work([&] { torch_adam.zero_grad(); });
    adam.zero_grad();
    reference_work([&] { backward_on(reference, inputs[step], targets[step]); });
    backward_on(model, inputs[step], targets[step]);
    reference_work([&] { torch_adam.step(); });
    adam.step();
    const double difference = max_relative_difference(model->parameters(), reference->parameters());
    EXPECT_LE(difference, 1e-6) << "step " << step;
    worst = std::max(worst, difference);
  };
  constexpr int kSaveAt = 6;
  for (int step = 0; step < kSaveAt; ++step) train_step(step);
  std::printf("two groups (lr 1e-3, 1e-2 then 3e-3) vs torch: max relative difference %.3g\n",
              worst);

  // Save, then build a copy of the model (plain tensors, managed afresh by the
  // new optimizer) and load into a fresh optimizer.
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    adam.save(archive);
    archive.save_to(saved);
  }
  torch::nn::Sequential copy = make_mlp(99);
  {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor> from = model->parameters();
    std::vector<torch::Tensor> to = copy->parameters();
    for (std::size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  spillway::optim::Adam restored(groups_of(copy), torch::optim::AdamOptions(1e-3));
  {
    torch::serialize::InputArchive archive;
    archive.load_from(saved);
    restored.load(archive);
  }
  EXPECT_DOUBLE_EQ(
      static_cast<torch::optim::AdamOptions&>(restored.param_groups()[1].options()).lr(), 3e-3);
  for (int step = kSaveAt; step < kSteps; ++step) {
    train_step(step);
    restored.zero_grad();
    backward_on(copy, inputs[step], targets[step]);
    restored.step();
    EXPECT_TRUE(all_equal(copy->parameters(), model->parameters()))
        << "step " << step << ": the restored optimizer departs by "
        << max_relative_difference(copy->parameters(), model->parameters());
  }
}

// Gradient accumulation over 4 micro-batches (loss / 4 each) equals one step
// on the whole batch, within fp32 rounding; also with set-to-none zero_grad.
TEST(ChunkedOptimizer, GradientAccumulationEqualsTheLargeBatch) {
  constexpr int kSteps = 5;
  constexpr int kMicro = 4;
  torch::set_num_threads(1);
  configure_spillway();
  torch::manual_seed(5);
  const torch::Tensor inputs = torch::randn({kSteps, kMicro * kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kMicro * kBatch, kOutputs});
  const auto options = torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(1e-4);
  for (const bool set_to_none : {false, true}) {
    torch::nn::Sequential large = make_mlp(6);
    torch::nn::Sequential accumulated = make_mlp(6);
    spillway::optim::SGD large_sgd(large->parameters(), options);
    spillway::optim::SGD accumulated_sgd(accumulated->parameters(), options);
    double worst = 0;
    for (int step = 0; step < kSteps; ++step) {
      large_sgd.zero_grad();
      backward_on(large, inputs[step], targets[step]);
      large_sgd.step();
      if (set_to_none) {
        for (torch::Tensor& param : accumulated->parameters()) param.mutable_grad().reset();
      } else {
        accumulated_sgd.zero_grad();
      }
      for (int micro = 0; micro < kMicro; ++micro) {
        const auto rows = torch::indexing::Slice(micro * kBatch, (micro + 1) * kBatch);
        backward_on(accumulated, inputs[step].index({rows}), targets[step].index({rows}),
                    1.0 / kMicro);
      }
      accumulated_sgd.step();
      spillway::step();
      worst =
          std::max(worst, max_relative_difference(accumulated->parameters(), large->parameters()));
    }
    std::printf(
        "accumulation over %d micro-batches (%s zero_grad) vs one batch: max relative "
        "difference %.3g\n",
        kMicro, set_to_none ? "set-to-none" : "in-place", worst);
    EXPECT_LE(worst, 1e-5);
    EXPECT_EQ(accumulated_sgd.placement().host + accumulated_sgd.placement().device,
              static_cast<std::int64_t>(accumulated->parameters().size()) * kSteps);
  }
}

// A regression task trained in bf16 (fp32 master copies in chunks) ends
// within 2% of the same training in fp32.
TEST(ChunkedOptimizer, Bf16WithFp32MasterMatchesFp32Training) {
  // Far more samples than the student has parameters, so both runs end at
  // the noise floor (0.01) rather than overfitting towards zero.
  constexpr int kSteps = 400;
  constexpr int kSamples = 4096;
  torch::set_num_threads(1);
  configure_spillway();
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({kSamples, 32});
  const torch::Tensor teacher_hidden = torch::randn({32, 64}) / std::sqrt(32.0);
  const torch::Tensor teacher_out = torch::randn({64, 1}) / std::sqrt(64.0);
  const torch::Tensor y =
      torch::tanh(x.matmul(teacher_hidden)).matmul(teacher_out) + 0.1 * torch::randn({kSamples, 1});

  auto train = [&](torch::ScalarType dtype) {
    torch::manual_seed(8);
    torch::nn::Sequential student(torch::nn::Linear(32, 32), torch::nn::Tanh(),
                                  torch::nn::Linear(32, 1));
    student->to(dtype);
    spillway::optim::Adam adam(student->parameters(), torch::optim::AdamOptions(1e-2));
    const torch::Tensor input = x.to(dtype);
    for (int step = 0; step < kSteps; ++step) {
      adam.zero_grad();
      torch::mse_loss(student->forward(input).to(torch::kFloat), y).backward();
      adam.step();
    }
    torch::NoGradGuard no_grad;
    return torch::mse_loss(student->forward(input).to(torch::kFloat), y).item<double>();
  };
  const double fp32_loss = train(torch::kFloat);
  const double bf16_loss = train(torch::kBFloat16);
  std::printf(
      "final regression loss after %d steps: fp32 %.6f, bf16 with fp32 master %.6f "
      "(%+.2f%%)\n",
      kSteps, fp32_loss, bf16_loss, 100.0 * (bf16_loss - fp32_loss) / fp32_loss);
  EXPECT_LE(std::fabs(bf16_loss - fp32_loss), 0.02 * fp32_loss);
}

double torch_global_norm(torch::nn::Sequential& model) {
  spillway::torch_bridge::HostWorkScope host;  // the check's temporaries: off the budget
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (const torch::Tensor& param : model->parameters())
    sum += param.grad().to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sum);
}

// The global norm is torch's norm of all gradients; found_inf sees an inf or
// a NaN; step_scaled(s) equals step on gradients multiplied by s.
TEST(ChunkedOptimizer, GradientSummaryAndScaledStep) {
  constexpr int kSteps = 4;
  constexpr double kScale = 0.25;
  torch::set_num_threads(1);
  configure_spillway();
  torch::nn::Sequential reference = reference_work([] { return make_mlp(9); });
  torch::nn::Sequential model = make_mlp(9);
  torch::optim::Adam torch_adam(reference->parameters(), torch::optim::AdamOptions(1e-3));
  spillway::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::manual_seed(10);
  const torch::Tensor inputs = torch::randn({kSteps, kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kBatch, kOutputs});

  double worst_norm = 0;
  double worst_param = 0;
  for (int step = 0; step < kSteps; ++step) {
    reference_work([&] { torch_adam.zero_grad(); });
    adam.zero_grad();
    reference_work([&] { backward_on(reference, inputs[step], targets[step]); });
    backward_on(model, inputs[step], targets[step]);
    const double expected = torch_global_norm(model);
    const spillway::optim::GradientSummary summary = adam.gradient_summary();
    const spillway::optim::GradientSummary scaled = adam.gradient_summary(kScale);
    EXPECT_FALSE(summary.found_inf);
    worst_norm = std::max(worst_norm, std::fabs(summary.global_norm - expected) / expected);
    worst_norm = std::max(worst_norm,
                          std::fabs(scaled.global_norm - kScale * expected) / (kScale * expected));
    {
      torch::NoGradGuard no_grad;
      reference_work([&] {
        for (const torch::Tensor& param : reference->parameters()) param.grad().mul_(kScale);
      });
    }
    reference_work([&] { torch_adam.step(); });
    adam.step_scaled(kScale);
    worst_param = std::max(worst_param,
                           max_relative_difference(model->parameters(), reference->parameters()));
  }
  std::printf(
      "gradient_summary vs torch's global norm: max relative difference %.3g; "
      "step_scaled(%.2f) vs torch on scaled gradients: max relative difference %.3g\n",
      worst_norm, kScale, worst_param);
  EXPECT_LE(worst_norm, 1e-6);
  EXPECT_LE(worst_param, 1e-6);

  for (const double bad :
       {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    adam.zero_grad();
    backward_on(model, inputs[0], targets[0]);
    EXPECT_FALSE(adam.gradient_summary().found_inf);
    {
      torch::NoGradGuard no_grad;
      model->parameters()[4].grad().view({-1})[17].fill_(bad);
    }
    EXPECT_TRUE(adam.gradient_summary().found_inf) << "gradient holding " << bad;
  }
}

// A parameter whose gradient is undefined (set to none, no backward since) is
// skipped and its step count stays behind, as in torch: Adam's bias
// correction then differs per parameter, and the results still match.
TEST(ChunkedOptimizer, UndefinedGradientsAreSkippedAsTorchDoes) {
  constexpr int kSteps = 4;
  torch::set_num_threads(1);
  configure_spillway();
  torch::nn::Sequential reference = reference_work([] { return make_mlp(12); });
  torch::nn::Sequential model = make_mlp(12);
  torch::optim::Adam torch_adam(reference->parameters(), torch::optim::AdamOptions(1e-3));
  spillway::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::manual_seed(13);
  const torch::Tensor inputs = torch::randn({kSteps, kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kBatch, kOutputs});
  for (int step = 0; step < kSteps; ++step) {
    reference_work([&] { torch_adam.zero_grad(); });
    adam.zero_grad();
    reference_work([&] { backward_on(reference, inputs[step], targets[step]); });
    backward_on(model, inputs[step], targets[step]);
    if (step == 1) {  // the first layer's weight gets no gradient this step
      reference->parameters()[0].mutable_grad().reset();
      model->parameters()[0].mutable_grad().reset();
    }
    const torch::Tensor before = model->parameters()[0].detach().clone();
    reference_work([&] { torch_adam.step(); });
    adam.step();
    if (step == 1) EXPECT_TRUE(torch::equal(before, model->parameters()[0].detach()));
    EXPECT_TRUE(all_equal(model->parameters(), reference->parameters()))
        << "step " << step << ": max relative difference "
        << max_relative_difference(model->parameters(), reference->parameters());
  }
  const std::int64_t tensors = static_cast<std::int64_t>(model->parameters().size());
  EXPECT_EQ(adam.placement().host + adam.placement().device, tensors * kSteps - 1);
}

// Note [A master copy starts at the first step]: bf16 weights written
// after the optimizer was built (a checkpoint loaded into the model) are
// where the first step starts; before it, param_state reports them widened.
TEST(ChunkedOptimizer, Bf16WeightsWrittenBeforeTheFirstStepAreItsStart) {
  torch::set_num_threads(1);
  configure_spillway();
  torch::nn::Sequential model = make_mlp(12);
  model->to(torch::kBFloat16);
  spillway::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3));
  const torch::Tensor weight = model->parameters()[0];
  const torch::Tensor loaded = torch::randn(weight.sizes()).to(torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    weight.copy_(loaded);
  }
  const auto before = adam.param_state(weight);
  ASSERT_TRUE(before.has_value());
  EXPECT_TRUE(torch::equal(before->master, loaded.to(torch::kFloat).reshape({-1})));
  for (const auto& p : model->parameters()) p.mutable_grad() = torch::zeros_like(p);
  adam.step();  // zero gradients: Adam's update is zero, the weight stays
  EXPECT_TRUE(torch::equal(weight.detach(), loaded));
}

// Parameters of a group added after construction are managed and given
// state at the next step, and train as torch's do.
TEST(ChunkedOptimizer, AddedParamGroupTrainsAsTorch) {
  constexpr int kSteps = 4;
  torch::set_num_threads(1);
  configure_spillway();
  torch::nn::Sequential reference = reference_work([] { return make_mlp(14); });
  torch::nn::Sequential model = make_mlp(14);
  auto first_two = [](torch::nn::Sequential& m) {
    const std::vector<torch::Tensor> params = m->parameters();
    return std::vector<torch::Tensor>(params.begin(), params.begin() + 2);
  };
  auto the_rest = [](torch::nn::Sequential& m) {
    const std::vector<torch::Tensor> params = m->parameters();
    return std::vector<torch::Tensor>(params.begin() + 2, params.end());
  };
  torch::optim::AdamW torch_adamw(first_two(reference), torch::optim::AdamWOptions(1e-3));
  spillway::optim::AdamW adamw(first_two(model), torch::optim::AdamWOptions(1e-3));
  torch::manual_seed(15);
  const torch::Tensor inputs = torch::randn({kSteps, kBatch, kInputs});
  const torch::Tensor targets = torch::randn({kSteps, kBatch, kOutputs});
  for (int step = 0; step < kSteps; ++step) {
    if (step == 2) {
      torch_adamw.add_param_group(torch::optim::OptimizerParamGroup(
          the_rest(reference), std::make_unique<torch::optim::AdamWOptions>(5e-3)));
      adamw.add_param_group(torch::optim::OptimizerParamGroup(
          the_rest(model), std::make_unique<torch::optim::AdamWOptions>(5e-3)));
    }
    reference_work([&] { torch_adamw.zero_grad(); });
    adamw.zero_grad();
    reference_work([&] { backward_on(reference, inputs[step], targets[step]); });
    backward_on(model, inputs[step], targets[step]);
    reference_work([&] { torch_adamw.step(); });
    adamw.step();
    EXPECT_TRUE(all_equal(model->parameters(), reference->parameters()))
        << "step " << step << ": max relative difference "
        << max_relative_difference(model->parameters(), reference->parameters());
  }
}

// Note [One kernel call per run]: parameters laid back to back in every
// array update with one kernel call, and the runs split where they must: at a
// group, a dtype, a parameter without a gradient (torch skips it), a step
// count behind (that parameter's bias correction differs), and the padding
// after a tensor whose bytes are not a multiple of the chunk alignment. The
// results stay bit-identical to torch's AdamW, also for the bf16 parameters'
// fp32 master copies, and a tied parameter (listed again in the second group)
// is stepped once. Splitting less (ignoring a hole, or the step counts) or
// more shows in the kernel calls per step, and the former in the values.
TEST(ChunkedOptimizer, OneKernelCallPerRunOfBackToBackParameters) {
  constexpr int kSteps = 6;
  torch::set_num_threads(1);
  configure_spillway();
  torch::manual_seed(16);
  // Group A: five fp32 parameters, the fourth (a3) without a gradient at
  // steps 0 and 2, then two bf16 ones. Group B: four fp32 parameters, b2 of
  // 100 elements (400 bytes, padded to the 256-byte alignment), then a1 again.
  struct Spec {
    std::vector<std::int64_t> shape;
    torch::ScalarType dtype;
  };
  const std::vector<Spec> specs_a = {{{64, 256}, torch::kFloat},  {{512}, torch::kFloat},
                                     {{128, 128}, torch::kFloat}, {{256}, torch::kFloat},
                                     {{1024}, torch::kFloat},     {{128, 64}, torch::kBFloat16},
                                     {{256}, torch::kBFloat16}};
  const std::vector<Spec> specs_b = {{{64, 128}, torch::kFloat},
                                     {{256}, torch::kFloat},
                                     {{100}, torch::kFloat},
                                     {{128}, torch::kFloat}};
  constexpr std::size_t kSkipped = 3;  // a3
  auto make = [](const std::vector<Spec>& specs, std::vector<torch::Tensor>& ours,
                 std::vector<torch::Tensor>& theirs) {
    for (const Spec& spec : specs) {
      const torch::Tensor value = torch::randn(spec.shape).to(spec.dtype);
      ours.push_back(value.clone().set_requires_grad(true));
      // torch steps the fp32 master copy's equal: the value widened.
      theirs.push_back(value.to(torch::kFloat).set_requires_grad(true));
    }
  };
  std::vector<torch::Tensor> ours_a, theirs_a, ours_b, theirs_b;
  make(specs_a, ours_a, theirs_a);
  make(specs_b, ours_b, theirs_b);
  const auto options_a = torch::optim::AdamWOptions(1e-3).weight_decay(1e-2);
  const auto options_b = torch::optim::AdamWOptions(5e-3).betas({0.8, 0.99}).weight_decay(0.1);
  auto groups = [](std::vector<torch::Tensor> a, std::vector<torch::Tensor> b, auto oa, auto ob) {
    std::vector<torch::optim::OptimizerParamGroup> made;
    made.emplace_back(std::move(a), std::make_unique<torch::optim::AdamWOptions>(oa));
    made.emplace_back(std::move(b), std::make_unique<torch::optim::AdamWOptions>(ob));
    return made;
  };
  std::vector<torch::Tensor> ours_b_tied = ours_b;
  ours_b_tied.push_back(ours_a[1]);
  torch::optim::AdamW reference(groups(theirs_a, theirs_b, options_a, options_b), options_a);
  spillway::optim::AdamW adamw(groups(ours_a, ours_b_tied, options_a, options_b), options_a);

  std::vector<torch::Tensor> ours = ours_a;
  ours.insert(ours.end(), ours_b.begin(), ours_b.end());
  std::vector<torch::Tensor> theirs = theirs_a;
  theirs.insert(theirs.end(), theirs_b.begin(), theirs_b.end());
  // Runs per step: A fp32 [a0 a1 a2] [a3] [a4], A bf16 [a5 a6], B [b0 b1 b2]
  // [b3]; a3 is missing at steps 0 and 2, and is a step behind (fresh at
  // step 1) afterwards, so a run of its own.
  const std::int64_t expected_calls[kSteps] = {5, 6, 5, 6, 6, 6};
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t i = 0; i < ours.size(); ++i) {
      const bool skip = i == kSkipped && (step == 0 || step == 2);
      // The gradient in the parameter's dtype; torch's is its exact widening.
      const torch::Tensor grad = torch::randn(ours[i].sizes()).to(ours[i].scalar_type());
      if (skip) {
        ours[i].mutable_grad().reset();
        theirs[i].mutable_grad().reset();
      } else {
        ours[i].mutable_grad() = grad.clone();
        theirs[i].mutable_grad() = grad.to(torch::kFloat);
      }
    }
    const std::int64_t calls_before = adamw.placement().kernel_calls;
    reference.step();
    adamw.step();
    EXPECT_EQ(adamw.placement().kernel_calls - calls_before, expected_calls[step])
        << "step " << step;
    for (std::size_t i = 0; i < ours.size(); ++i) {
      const torch::Tensor expected = theirs[i].detach().to(ours[i].scalar_type());
      EXPECT_TRUE(torch::equal(ours[i].detach(), expected))
          << "step " << step << ", parameter " << i << ": max difference "
          << (ours[i].detach().to(torch::kDouble) - expected.to(torch::kDouble)).abs().max();
      if (ours[i].scalar_type() == torch::kBFloat16) {
        const auto state = adamw.param_state(ours[i]);
        ASSERT_TRUE(state.has_value());
        EXPECT_TRUE(torch::equal(state->master, theirs[i].detach().view({-1})))
            << "step " << step << ", the master copy of parameter " << i;
      }
    }
  }
  // The tied a1 stepped once per step, the skipped a3 four times.
  EXPECT_EQ(adamw.param_state(ours_a[1])->step, kSteps);
  EXPECT_EQ(adamw.param_state(ours_a[kSkipped])->step, kSteps - 2);
}

TEST(ChunkedOptimizer, AmsgradIsRejectedByName) {
  configure_spillway();
  torch::nn::Sequential model = make_mlp(11);
  try {
    spillway::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
    FAIL() << "amsgrad was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("amsgrad"), std::string::npos) << e.what();
  }
}

}  // namespace
