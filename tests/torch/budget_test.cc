// Note [An op never runs on bytes that are not resident] (hooks/torch/
// op_hooks.cc): a budget of one chunk and an op that needs two. The op runs
// past the budget, on resident bytes (strict residency: a miss would fault),
// training stays bit-identical to torch, the overrun is counted, and the
// step boundary raises the error that names the op and the budget to set
// (Note [A budget below the smallest] in manage.cc). Where the device cannot
// hold the overrun either, the process stops with the error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "hooks/torch/spillway_torch.h"

namespace {

using ::testing::HasSubstr;

constexpr std::int64_t kVocab = 2048;
constexpr std::int64_t kWidth = 1024;  // the embedding: 2048 x 1024 fp32 = one 8 MiB chunk
constexpr int kSteps = 4;

std::string conf(const std::string& sim_capacity) {
  return "device:sim,strict_residency:true,chunk_size:8MiB,device_budget:12MiB,policy:lru,"
         "sim_capacity:" +
         sim_capacity;
}

// The LM head's bias, a module of its own so that it is registered last.
struct HeadBias : torch::nn::Module {
  HeadBias() { bias = register_parameter("bias", torch::zeros({kVocab})); }
  torch::Tensor bias;
};

// A tied embedding and LM head. The embedding fills one 8 MiB chunk, the
// head's bias sits in the next, so the head's aten::linear needs both chunks
// at once (16 MiB); the 12 MiB budget holds one with the activations (on the
// sim device they count too). The embedding is frozen: its gradient would be
// two 8 MiB temporaries (tied), more than the budget leaves besides a chunk.
struct TiedLm : torch::nn::Module {
  TiedLm() {
    embedding = register_module("embedding", torch::nn::Embedding(kVocab, kWidth));
    embedding->weight.requires_grad_(false);
    head = register_module("head", std::make_shared<HeadBias>());
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    const torch::Tensor h = torch::tanh(embedding->forward(tokens));
    return torch::linear(h, embedding->weight, head->bias);  // aten::linear: one op
  }
  torch::nn::Embedding embedding{nullptr};
  std::shared_ptr<HeadBias> head;
};

std::shared_ptr<TiedLm> make_model() {
  torch::manual_seed(7);
  return std::make_shared<TiedLm>();
}

torch::Tensor tokens_of_step(int step) {
  torch::manual_seed(100 + step);
  return torch::randint(kVocab, {4, 8}, torch::kLong);  // small activations: a slab holds them
}

torch::Tensor loss_of(TiedLm& model, int step) {
  const torch::Tensor tokens = tokens_of_step(step);
  const torch::Tensor logits = model.forward(tokens);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                              tokens.roll(1, 1).reshape({-1}));
}

nlohmann::json memory_stats() { return nlohmann::json::parse(spillway::memory_stats_json()); }

TEST(TorchBridgeBudgetOverrun, AnOpNeedingTwoChunksUnderAOneChunkBudgetRunsOnResidentBytes) {
  torch::set_num_threads(1);  // bit for bit: two threads' matmuls vary run to run (train-demo.md)
  // Plain torch first.
  std::vector<float> plain_losses;
  auto plain = make_model();
  {
    torch::optim::SGD optimizer(plain->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < kSteps; ++step) {
      optimizer.zero_grad();
      torch::Tensor loss = loss_of(*plain, step);
      loss.backward();
      optimizer.step();
      plain_losses.push_back(loss.item<float>());
    }
  }

  spillway::configure(conf("256MiB"));
  auto managed = make_model();
  spillway::manage(*managed);
  torch::optim::SGD optimizer(managed->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = loss_of(*managed, step);
    loss.backward();
    optimizer.step();
    EXPECT_EQ(loss.item<float>(), plain_losses[step]) << "step " << step;
    if (step == 0) {
      try {
        spillway::step();
        ADD_FAILURE() << "the first step boundary accepted a budget below an op's chunks";
      } catch (const std::runtime_error& e) {
        const std::string message = e.what();
        EXPECT_THAT(message, HasSubstr("aten::"));
        EXPECT_THAT(message, HasSubstr("16.00 MiB of chunks"));
        EXPECT_THAT(message, HasSubstr("device_budget to at least 16.00 MiB"));
      }
    } else {
      EXPECT_NO_THROW(spillway::step()) << "step " << step << ": reported once";
    }
  }
  const auto plain_params = plain->parameters();
  const auto managed_params = managed->parameters();
  ASSERT_EQ(plain_params.size(), managed_params.size());
  for (std::size_t i = 0; i < plain_params.size(); ++i)
    EXPECT_TRUE(torch::equal(plain_params[i], managed_params[i])) << "parameter " << i;

  const nlohmann::json stats = memory_stats();
  EXPECT_GT(stats["num_budget_overruns"].get<std::int64_t>(), 0);
  EXPECT_EQ(stats["min_budget_bytes"].get<std::int64_t>(), 16 << 20);
  EXPECT_EQ(stats["num_ooms"].get<std::int64_t>(), 0);
  EXPECT_GT(stats["allocated_bytes.model.peak"].get<std::int64_t>(), 8 << 20);
  EXPECT_GT(stats["allocated_bytes.non_model.peak"].get<std::int64_t>(), 0);
  // Between ops the overrun has ended.
  EXPECT_LE(stats["reserved_bytes.all.current"].get<std::int64_t>(), 12 << 20);
}

// Past the budget there must still be room on the device; where there is
// none, the op must not run on bytes that are not there: the process stops.
TEST(TorchBridgeBudgetOverrunDeathTest, NoRoomEvenPastTheBudgetStopsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        spillway::configure(conf("16MiB"));
        auto model = make_model();
        spillway::manage(*model);
        loss_of(*model, 0).backward();
      },
      "Stopping the process: the op would otherwise compute on bytes that are not resident");
}

}  // namespace
