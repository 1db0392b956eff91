// bf16 mixed precision trains the demo's task as well as fp32: spillway's
// Adam with fp32 master copies in chunks, parameters and gradients in bf16,
// chunks spilling every step, ends within 2% of the fp32 run's loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "hooks/torch/spillway_torch.h"
#include "tools/train_demo/trainer.h"

namespace spillway::train_demo {
namespace {

constexpr int kSteps = 40;
constexpr int kTail = 10;  // one batch's loss is noisy: the mean of the last ten

double final_loss(torch::Dtype dtype) {
  TrainerOptions options;
  options.optimizer = OptimizerKind::spillway_adam;
  options.manage = true;
  options.dtype = dtype;
  Trainer trainer(options);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) losses.push_back(trainer.step());
  EXPECT_LT(losses.back(), losses.front()) << "did not train";
  return std::accumulate(losses.end() - kTail, losses.end(), 0.0) / kTail;
}

TEST(TrainDemoBf16, FinalLossWithinTwoPercentOfFp32) {
  // The demo's default: 2 MiB chunks under a 48 MiB budget (which also holds the
  // activations, tools/train_demo/spillway_train_demo.cc), strict residency.
  spillway::configure(
      "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:48MiB,sim_capacity:256MiB,"
      "policy:lru");
  const double fp32 = final_loss(torch::kFloat);
  const double bf16 = final_loss(torch::kBFloat16);
  const double relative = std::abs(bf16 - fp32) / fp32;
  std::printf("final loss (mean of the last %d of %d steps): fp32 %.5f, bf16 %.5f (%.2f%%)\n",
              kTail, kSteps, fp32, bf16, 100 * relative);
  EXPECT_LE(relative, 0.02);
}

TEST(TrainDemoBf16, TorchAdamIsRefusedForBf16) {
  TrainerOptions options;
  options.dtype = torch::kBFloat16;
  EXPECT_THROW(Trainer{options}, std::invalid_argument);
}

}  // namespace
}  // namespace spillway::train_demo
