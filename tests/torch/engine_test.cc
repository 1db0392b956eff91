// initialize(): DeepSpeed-style configurations drive spillway's engine, which
// matches plain LibTorch training (torch::optim, clip_grad_norm_, a large
// batch for accumulated micro-batches), skips fp16 steps that overflow, and
// rejects bad configurations by key before touching the model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "hooks/torch/engine.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

namespace {

// The same spillway block for every engine in this program (the runtime is
// configured once per process): 2 MiB chunks under a 6 MiB budget, so the
// MLP's chunks move every step.
constexpr const char* kSpillwayBlock =
    R"("spillway": {"device": "sim", "strict_residency": true, "chunk_size": "2MiB",
                    "device_budget": "6MiB", "sim_capacity": "256MiB", "policy": "lru"})";

constexpr int kInputs = 64;
constexpr int kWidth = 512;
constexpr int kOutputs = 8;
constexpr int kSteps = 5;

torch::nn::Sequential make_mlp(std::uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kInputs, kWidth), torch::nn::Tanh(),
                               torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh(),
                               torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh(),
                               torch::nn::Linear(kWidth, kOutputs));
}

struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

std::vector<Batch> make_batches(int count, int batch, std::uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<Batch> batches;
  for (int i = 0; i < count; ++i)
    batches.push_back({torch::randn({batch, kInputs}), torch::randn({batch, kOutputs})});
  return batches;
}

std::string config_with(const std::string& blocks) {
  return "{" + blocks + ", " + kSpillwayBlock + "}";
}

// Largest |a - b| / max(|b|, 1e-3) over all parameters.
double max_relative_difference(const std::vector<torch::Tensor>& actual,
                               const std::vector<torch::Tensor>& expected) {
  spillway::torch_bridge::HostWorkScope host;  // the check's temporaries: off the budget
  double worst = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const torch::Tensor a = actual[i].detach().to(torch::kDouble);
    const torch::Tensor b = expected[i].detach().to(torch::kDouble);
    const double diff = ((a - b).abs() / b.abs().clamp_min(1e-3)).max().item<double>();
    worst = std::max(worst, diff);
  }
  return worst;
}

std::vector<torch::Tensor> snapshot(torch::nn::Module& module) {
  spillway::torch_bridge::HostWorkScope host;  // the check's temporaries: off the budget
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& param : module.parameters()) params.push_back(param.detach().clone());
  return params;
}

// The reference (plain torch::optim) works on torch's own memory: on the sim
// device spillway is torch's CPU allocator, and the reference's gradients and
// state would otherwise share the engine's budget (Note [torch's CPU
// allocator on the sim device]).
template <typename Work>
auto reference_work(Work work) {
  spillway::torch_bridge::HostWorkScope host;
  return work();
}

std::uint64_t stat(const std::string& key) {
  const nlohmann::json stats = nlohmann::json::parse(spillway::memory_stats_json());
  return stats.contains(key) ? stats.at(key).get<std::uint64_t>() : 0;
}

TEST(Initialize, AdamEngineMatchesTorchAdamEveryStep) {
  const auto batches = make_batches(kSteps, 16, 7);
  auto reference = reference_work([] { return make_mlp(1); });
  torch::optim::Adam torch_adam(reference->parameters(),
                                torch::optim::AdamOptions(1e-3).weight_decay(0.01));
  auto engine = spillway::initialize(
      make_mlp(1), config_with(R"("optimizer": {"type": "Adam", "params": {"lr": 1e-3,
                                  "weight_decay": 0.01, "adam_w_mode": false}})"));
  const std::uint64_t fetched_before = stat("bytes_moved.h2d");
  double worst = 0;
  for (const Batch& batch : batches) {
    reference_work([&] {
      torch_adam.zero_grad();
      torch::mse_loss(reference->forward(batch.input), batch.target).backward();
      torch_adam.step();
    });

    const torch::Tensor loss = torch::mse_loss(engine.forward(batch.input), batch.target);
    engine.backward(loss);
    EXPECT_TRUE(engine.step());
    worst =
        std::max(worst, max_relative_difference(snapshot(*engine.module()), snapshot(*reference)));
  }
  std::printf("max relative parameter difference, engine Adam vs torch::optim::Adam: %.3g\n",
              worst);
  EXPECT_LE(worst, 1e-6);
  EXPECT_EQ(engine.global_steps(), static_cast<std::uint64_t>(kSteps));
  EXPECT_GT(stat("bytes_moved.h2d"), fetched_before);  // chunks did move
}

TEST(Initialize, GradientClippingMatchesClipGradNorm) {
  const auto batches = make_batches(kSteps, 16, 8);
  auto reference = reference_work([] { return make_mlp(2); });
  torch::optim::SGD torch_sgd(reference->parameters(),
                              torch::optim::SGDOptions(0.05).momentum(0.9));
  auto engine = spillway::initialize(
      make_mlp(2), config_with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.05,
                                  "momentum": 0.9}}, "gradient_clipping": 0.05)"));
  double worst = 0;
  for (const Batch& batch : batches) {
    const double norm = reference_work([&] {
      torch_sgd.zero_grad();
      torch::mse_loss(reference->forward(batch.input), batch.target).backward();
      const double clipped_norm = torch::nn::utils::clip_grad_norm_(reference->parameters(), 0.05);
      torch_sgd.step();
      return clipped_norm;
    });

    engine.backward(torch::mse_loss(engine.forward(batch.input), batch.target));
    engine.step();
    EXPECT_NEAR(engine.last_gradient_norm(), norm, 1e-5 * norm);
    EXPECT_GT(norm, 0.05);  // clipping did happen
    worst =
        std::max(worst, max_relative_difference(snapshot(*engine.module()), snapshot(*reference)));
  }
  std::printf("max relative parameter difference, clipped SGD vs torch: %.3g\n", worst);
  EXPECT_LE(worst, 1e-5);
}

// Gradient accumulation is torch's own: each micro-batch's loss over the
// number of micro-batches, backward into the same gradients, one step. So
// the engine's parameters equal bit for bit torch's AdamW stepped that way,
// and before each step its gradients are the large batch's, to rounding.
// (The parameters after several Adam steps are not compared with the large
// batch's: Adam divides by the gradient's magnitude, so an element whose
// gradient is rounding noise moves by up to the learning rate either way.)
TEST(Initialize, AccumulatedMicroBatchesMatchTheLargeBatch) {
  // With 2 threads, torch's CPU matmuls here differed once in about 100
  // runs from the same matmuls run again in the same process; with one
  // they are the same every time, so the comparison can be exact.
  torch::set_num_threads(1);
  constexpr int kMicro = 4;
  const auto large = make_batches(kSteps, 32, 9);
  auto reference = reference_work([] { return make_mlp(3); });
  auto large_batch = reference_work([] { return make_mlp(3); });
  torch::optim::AdamW torch_adamw(reference->parameters(), torch::optim::AdamWOptions(1e-3));
  auto engine = spillway::initialize(
      make_mlp(3), config_with(R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
                                  "weight_decay": 0.01}}, "gradient_accumulation_steps": 4,
                                  "train_batch_size": 32, "train_micro_batch_size_per_gpu": 8)"));
  double worst_gradient = 0;
  for (const Batch& batch : large) {
    const auto inputs = batch.input.chunk(kMicro);
    const auto targets = batch.target.chunk(kMicro);
    reference_work([&] {
      torch_adamw.zero_grad();
      for (int micro = 0; micro < kMicro; ++micro)
        (torch::mse_loss(reference->forward(inputs[micro]), targets[micro]) / kMicro).backward();
      // The large batch's gradients at the same parameters.
      const auto from = reference->parameters();
      auto to = large_batch->parameters();
      for (std::size_t i = 0; i < from.size(); ++i) {
        torch::NoGradGuard no_grad;
        to[i].copy_(from[i]);
        to[i].mutable_grad() = torch::Tensor();
      }
      torch::mse_loss(large_batch->forward(batch.input), batch.target).backward();
      torch_adamw.step();
    });

    for (int micro = 0; micro < kMicro; ++micro) {
      engine.backward(torch::mse_loss(engine.forward(inputs[micro]), targets[micro]));
      if (micro == kMicro - 1) {
        const auto params = engine.module()->parameters();
        const auto expected = large_batch->parameters();
        for (std::size_t i = 0; i < params.size(); ++i) {
          spillway::torch_bridge::HostWorkScope host;
          const torch::Tensor difference = (params[i].grad() - expected[i].grad()).abs().max();
          worst_gradient = std::max(
              worst_gradient, difference.item<double>() /
                                  std::max(expected[i].grad().abs().max().item<double>(), 1e-12));
        }
      }
      EXPECT_EQ(engine.step(), micro == kMicro - 1);
    }
  }
  EXPECT_EQ(engine.global_steps(), static_cast<std::uint64_t>(kSteps));
  EXPECT_EQ(engine.micro_steps(), static_cast<std::uint64_t>(kSteps * kMicro));
  std::printf("accumulated gradients vs the large batch's: max difference %.3g of the largest\n",
              worst_gradient);
  EXPECT_LE(worst_gradient, 1e-5);
  const auto actual = snapshot(*engine.module());
  const auto expected = snapshot(*reference);
  for (std::size_t i = 0; i < actual.size(); ++i)
    EXPECT_TRUE(torch::equal(actual[i], expected[i]))
        << "param " << i << ": max |difference| "
        << (actual[i] - expected[i]).abs().max().item<double>();
}

// Elementwise ops only: LibTorch's CPU kernels have no fp16 matmul.
struct ElementwiseModelImpl : torch::nn::Module {
  explicit ElementwiseModelImpl(int64_t size) {
    weight = register_parameter("weight", torch::full({size}, 0.5));
    bias = register_parameter("bias", torch::zeros({size}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x * weight + bias; }
  torch::Tensor weight, bias;
};
TORCH_MODULE(ElementwiseModel);

TEST(Initialize, Fp16OverflowSkipsTheStepAndLowersTheScale) {
  constexpr int64_t kSize = 1 << 16;
  auto engine = spillway::initialize(
      ElementwiseModel(kSize), config_with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.01}},
                     "fp16": {"enabled": true, "initial_scale_power": 24, "hysteresis": 1,
                              "loss_scale_window": 1000})"));
  EXPECT_EQ(engine.compute_dtype(), torch::kHalf);
  EXPECT_EQ(engine.module()->weight.scalar_type(), torch::kHalf);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({kSize}).to(torch::kHalf);
  const torch::Tensor target = (x * 2 + 1).to(torch::kHalf);
  // Sum of squares: a gradient 2(y - t)x times 2^24 overflows fp16 (max 65504).
  auto loss_of = [&] { return ((engine.forward(x) - target).to(torch::kFloat).pow(2)).sum(); };

  const torch::Tensor before = engine.module()->weight.detach().clone();
  engine.backward(loss_of());
  EXPECT_FALSE(engine.step());
  EXPECT_EQ(engine.skipped_steps(), 1u);
  EXPECT_EQ(engine.loss_scale(), std::ldexp(1.0, 23));
  EXPECT_TRUE(torch::equal(engine.module()->weight.detach(), before))
      << "a skipped step changed weights";

  // The scale keeps halving until gradients fit, then training proceeds.
  const double first_loss = loss_of().item<double>();
  int steps_taken = 0;
  for (int i = 0; i < 40; ++i) {
    engine.backward(loss_of());
    steps_taken += engine.step() ? 1 : 0;
  }
  EXPECT_GT(steps_taken, 10);
  EXPECT_LT(engine.loss_scale(), std::ldexp(1.0, 23));
  EXPECT_GE(engine.loss_scale(), 1.0);
  EXPECT_LT(loss_of().item<double>(), 0.5 * first_loss);
  std::printf("fp16: %llu steps skipped, final scale %g, loss %.4f -> %.4f\n",
              static_cast<unsigned long long>(engine.skipped_steps()), engine.loss_scale(),
              first_loss, loss_of().item<double>());
}

TEST(Initialize, Bf16EngineCastsTheModelAndTrains) {
  const auto batches = make_batches(20, 16, 10);
  auto engine = spillway::initialize(
      make_mlp(5), config_with(R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                                  "bf16": {"enabled": true})"));
  EXPECT_EQ(engine.module()->parameters()[0].scalar_type(), torch::kBFloat16);
  auto loss_of = [&](const Batch& batch) {
    return torch::mse_loss(engine.forward(batch.input.to(torch::kBFloat16)).to(torch::kFloat),
                           batch.target);
  };
  const double first = loss_of(batches[0]).item<double>();
  for (int epoch = 0; epoch < 3; ++epoch)
    for (const Batch& batch : batches) {
      engine.backward(loss_of(batch));
      engine.step();
    }
  const double last = loss_of(batches[0]).item<double>();
  EXPECT_LT(last, 0.8 * first);
}

using ::testing::HasSubstr;

TEST(Initialize, BadConfigurationsAreRejectedByNameBeforeTouchingTheModel) {
  auto expect_rejected = [](const std::string& json, const std::string& key) {
    auto model = make_mlp(6);
    const torch::Tensor first_weight = model->parameters()[0];
    const void* address = first_weight.data_ptr();
    try {
      spillway::initialize(model, json);
      ADD_FAILURE() << "accepted: " << json;
    } catch (const std::invalid_argument& error) {
      EXPECT_THAT(error.what(), HasSubstr(key)) << json;
    }
    EXPECT_EQ(model->parameters()[0].data_ptr(), address) << "the model was touched";
  };
  expect_rejected(config_with(R"("optimizer": {"type": "Adam"},
                     "zero_optimization": {"offload_optimizer": {"device": "nvme"}})"),
                  "zero_optimization.offload_optimizer.device");
  expect_rejected(config_with(R"("optimizer": {"type": "Adam", "params": {"lrr": 1}})"),
                  "optimizer.params.lrr");
  expect_rejected(config_with(R"("optimizer": {"type": "Adam"}, "fp16": {"enabled": 1})"),
                  "fp16.enabled");
  expect_rejected(R"({"optimizer": {"type": "Adam"}, "spillway": {"device_budget": "-1"}})",
                  "spillway.device_budget");
  expect_rejected(R"({"optimizer": {"type": "Adam"}, "spillway": {"policy": "random"}})",
                  "spillway.policy");
}

}  // namespace

namespace {

// DeepSpeed's WarmupLR, linear, as its lr_schedules.py computes it: the
// scheduler starts the optimizer at warmup_min_lr (last_batch_iteration -1);
// after applied step k it holds the lr of iteration k, which step k + 1 uses.
double warmup_linear_lr(double min_lr, double max_lr, int warmup, int step) {
  const int iteration = step - 1;
  if (iteration < 0) return min_lr;
  const double gamma = iteration < warmup ? static_cast<double>(iteration) / warmup : 1.0;
  return min_lr + (max_lr - min_lr) * gamma;
}

// Note [No std::filesystem beside libtorch] in hooks/torch/engine.cc.
void remove_tree(const std::string& dir) {
  ASSERT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string temporary_directory(const std::string& name) {
  const std::string dir = "/tmp/spillway-engine-" + name + "-" + std::to_string(::getpid());
  remove_tree(dir);
  return dir;
}

template <typename EngineType>
void train_micro_batches(EngineType& engine, const std::vector<Batch>& batches, std::size_t begin,
                         std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    engine.backward(torch::mse_loss(engine.forward(batches[i].input), batches[i].target));
    engine.step();
  }
}

}  // namespace

TEST(Initialize, TheSchedulerSetsEachStepsLrInDeepSpeedsOrder) {
  torch::set_num_threads(1);  // bit for bit: as in AccumulatedMicroBatchesMatchTheLargeBatch
  const auto batches = make_batches(8, 16, 11);
  auto reference = reference_work([] { return make_mlp(5); });
  torch::optim::SGD torch_sgd(reference->parameters(), torch::optim::SGDOptions(1.0));
  auto engine = spillway::initialize(
      make_mlp(5), config_with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.05}},
                     "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
                                   "warmup_max_lr": 0.01, "warmup_num_steps": 4,
                                   "warmup_type": "linear"}})"));
  ASSERT_TRUE(engine.has_lr_schedule());
  EXPECT_EQ(engine.lr_schedule_iteration(), -1);
  double worst = 0;
  for (int k = 0; k < static_cast<int>(batches.size()); ++k) {
    const double lr = warmup_linear_lr(0.001, 0.01, 4, k);
    ASSERT_EQ(engine.get_lr(), std::vector<double>{lr}) << "step " << k;
    reference_work([&] {
      static_cast<torch::optim::SGDOptions&>(torch_sgd.param_groups()[0].options()).lr(lr);
      torch_sgd.zero_grad();
      torch::mse_loss(reference->forward(batches[k].input), batches[k].target).backward();
      torch_sgd.step();
    });
    train_micro_batches(engine, batches, k, k + 1);
    worst =
        std::max(worst, max_relative_difference(snapshot(*engine.module()), snapshot(*reference)));
  }
  std::printf("max relative parameter difference, scheduled SGD vs torch: %.3g\n", worst);
  EXPECT_EQ(worst, 0);
  EXPECT_EQ(engine.lr_schedule_iteration(), 7);
}

TEST(Initialize, ACheckpointResumesBitIdenticallyWithOptimizerAndSchedulerState) {
  const auto batches = make_batches(16, 16, 12);
  const std::string config = config_with(
      R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-3,
                       "warmup_num_steps": 6}},
         "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1})");
  const std::string dir = temporary_directory("resume");
  auto engine = spillway::initialize(make_mlp(6), config);
  train_micro_batches(engine, batches, 0, 6);
  engine.save_checkpoint(dir);
  EXPECT_TRUE(is_regular_file(dir + "/global_step3/mp_rank_00_model_states.pt"));
  EXPECT_TRUE(is_regular_file(dir + "/global_step3/zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  train_micro_batches(engine, batches, 6, 16);
  const auto expected = snapshot(*engine.module());

  auto resumed = spillway::initialize(make_mlp(60), config);  // other values
  EXPECT_EQ(resumed.load_checkpoint(dir), dir + "/global_step3/mp_rank_00_model_states.pt");
  EXPECT_EQ(resumed.global_steps(), 3u);
  EXPECT_EQ(resumed.micro_steps(), 6u);
  EXPECT_EQ(resumed.lr_schedule_iteration(), 2);
  train_micro_batches(resumed, batches, 6, 16);
  EXPECT_EQ(max_relative_difference(snapshot(*resumed.module()), expected), 0);
  EXPECT_EQ(resumed.get_lr(), engine.get_lr());
  remove_tree(dir);
}

TEST(Initialize, LoadingAMissingOrMismatchedCheckpointNamesWhatIsWrong) {
  const std::string dir = temporary_directory("missing");
  auto engine = spillway::initialize(
      make_mlp(7), config_with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.01}})"));
  EXPECT_THAT([&] { engine.load_checkpoint(dir); },
              testing::ThrowsMessage<std::runtime_error>(testing::HasSubstr(dir + "/latest")));
  engine.save_checkpoint(dir, "mine");
  auto other =
      spillway::initialize(torch::nn::Sequential(torch::nn::Linear(kInputs, 4)),
                           config_with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.01}})"));
  EXPECT_THAT([&] { other.load_checkpoint(dir, "mine"); },
              testing::ThrowsMessage<std::invalid_argument>(testing::HasSubstr("0.weight")));
  remove_tree(dir);
}
