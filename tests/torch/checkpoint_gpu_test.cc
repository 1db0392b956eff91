// torch::save of a managed module on a GPU, mid-run, chunks evicted, under
// strict_residency (issue 16, item 4). LibTorch's serializer copies each CUDA
// tensor to the host with an op (getWriteableTensorData: set_ over the
// storage, then .cpu()), which the op hook fetches, so the file holds the
// true values. On the sim device the same read has no op (docs/torch-bridge.md,
// "Checkpoints in C++"). Skips where torch sees no usable GPU.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "allocator/runtime.h"
#include "hooks/torch/spillway_torch.h"

namespace {

constexpr std::int64_t kWidth = 1024;  // 4 MiB of fp32 weights a layer
constexpr int kLayers = 12;
constexpr std::int64_t kBatch = 16;
// The budget the test starts with and ends with: the whole model fits.
constexpr std::size_t kRoomyBudgetMiB = 256;

std::int64_t spillway_figure(const char* key) {
  return nlohmann::json::parse(spillway::memory_stats_json()).at(key).get<std::int64_t>();
}

torch::nn::Sequential make_mlp() {
  torch::nn::Sequential mlp;
  for (int layer = 0; layer < kLayers; ++layer) {
    mlp->push_back(torch::nn::Linear(kWidth, kWidth));
    mlp->push_back(torch::nn::Tanh());
  }
  return mlp;
}

TEST(TorchCheckpointOnGpu, SavedMidRunWithChunksEvictedHoldsTheTrueValues) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no usable GPU (torch::cuda::is_available)";
  spillway::configure("device:cuda,strict_residency:true,chunk_size:8MiB,device_budget:" +
                      std::to_string(kRoomyBudgetMiB) + "MiB");
  spillway::use_as_torch_cuda_allocator();
  torch::manual_seed(0);
  torch::nn::Sequential mlp = make_mlp();
  mlp->to(torch::kCUDA);  // whole on the device first, as a script has it
  spillway::manage(*mlp);
  torch::optim::SGD sgd(mlp->parameters(), torch::optim::SGDOptions(1e-2));
  const auto step = [&] {
    sgd.zero_grad();
    const torch::Tensor input = torch::randn({kBatch, kWidth}, torch::kCUDA);
    torch::mse_loss(mlp->forward(input), torch::zeros({kBatch, kWidth}, torch::kCUDA)).backward();
    sgd.step();
  };
  // A first step with every chunk resident measures what a step needs beside
  // the chunks: activations, and on a GPU cuBLAS's workspace, which the sim
  // device never asks for (the fixed 40 MiB budget this test first had threw
  // from the first step's matmul on the H200). The budget is that, the chunks
  // the largest op needs at once, the reserve beyond the allocated bytes and
  // one chunk: of about 96 MiB of parameters and gradients in 8 MiB chunks,
  // most are evicted.
  step();
  const std::int64_t budget =
      spillway_figure("allocated_bytes.non_model.peak") + spillway_figure("min_budget_bytes") +
      (spillway_figure("reserved_bytes.all.peak") - spillway_figure("allocated_bytes.all.peak")) +
      (std::int64_t{8} << 20);
  ASSERT_LT(budget, spillway_figure("allocated_bytes.non_model.peak") +
                        spillway_figure("chunk_bytes.capacity"))
      << "the derived budget holds every chunk: nothing would be evicted";
  spillway::Runtime::process().active_allocator()->set_budget_bytes(
      static_cast<std::size_t>(budget));
  for (int steps = 0; steps < 2; ++steps) step();
  ASSERT_GT(spillway_figure("evictions"), 0);
  ASSERT_LT(spillway_figure("chunk_bytes.device"), spillway_figure("chunk_bytes.capacity"))
      << "every chunk was resident when the checkpoint was saved";

  std::stringstream saved;
  torch::save(mlp, saved);
  // The true values, each copied out through an op.
  std::vector<torch::Tensor> expected;
  for (const torch::Tensor& param : mlp->parameters()) expected.push_back(param.detach().cpu());

  torch::nn::Sequential loaded = make_mlp();
  torch::load(loaded, saved, torch::Device(torch::kCPU));
  const std::vector<torch::Tensor> params = loaded->parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i], expected[i])) << "parameter " << i << " differs";
  // unmanage puts every parameter and gradient back on the device as plain
  // tensors, so the whole model must fit again (on the H200, unmanage under
  // the spilling budget refused, naming the chunk it had no room for).
  spillway::Runtime::process().active_allocator()->set_budget_bytes(kRoomyBudgetMiB << 20);
  spillway::unmanage(*mlp);
}

}  // namespace
