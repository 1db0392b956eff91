#include "tools/train_demo/trainer.h"

#include <stdexcept>

#include "hooks/torch/spillway_torch.h"

namespace spillway::train_demo {

namespace {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind,
                                                        std::vector<torch::Tensor> params,
                                                        double learning_rate) {
  switch (kind) {
    case OptimizerKind::torch_adam:
      return std::make_unique<torch::optim::Adam>(std::move(params),
                                                  torch::optim::AdamOptions(learning_rate));
    case OptimizerKind::spillway_adam:
      return std::make_unique<spillway::optim::Adam>(std::move(params),
                                                     torch::optim::AdamOptions(learning_rate));
  }
  throw std::logic_error("unknown optimizer kind");
}

// The weights depend on the seed alone: torch's global generator is seeded
// right before the model is built.
Gpt make_model(const GptConfig& config, std::uint64_t seed) {
  torch::manual_seed(seed);
  return Gpt(config);
}

}  // namespace

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "torch-adam") return OptimizerKind::torch_adam;
  if (name == "spillway-adam") return OptimizerKind::spillway_adam;
  throw std::invalid_argument("unknown optimizer '" + name +
                              "' (accepted: torch-adam, spillway-adam)");
}

std::vector<std::string> optimizer_names() { return {"torch-adam", "spillway-adam"}; }

Trainer::Trainer(const TrainerOptions& options)
    : options_(options),
      model_(make_model(options.model, options.seed)),
      // A seed of its own, so the data does not depend on how many random
      // numbers building the model drew.
      task_(options.model.vocab, options.seed + 1) {
  if (options.dtype != torch::kFloat) {
    if (options.optimizer != OptimizerKind::spillway_adam)
      throw std::invalid_argument(
          "bf16 training needs spillway-adam (fp32 master copies); torch-adam would round "
          "every update to bf16");
    model_->to(options.dtype);
  }
  // Built on the CPU from the seed, then moved: the same weights on any device.
  if (options.device != torch::kCPU) model_->to(options.device);
  if (options.manage) spillway::manage(*model_);
  optimizer_ = make_optimizer(options.optimizer, model_->parameters(), options.learning_rate);
}

float Trainer::step() {
  Batch batch = task_.next_batch(options_.batch, options_.model.sequence);
  if (options_.device != torch::kCPU) {
    batch.tokens = batch.tokens.to(options_.device);
    batch.targets = batch.targets.to(options_.device);
  }
  optimizer_->zero_grad();
  // The loss in float whatever the model's dtype (a no-op for float).
  const torch::Tensor logits = model_->forward(batch.tokens).to(torch::kFloat);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, options_.model.vocab}), batch.targets.reshape({-1}));
  loss.backward();
  optimizer_->step();
  spillway::step();
  return loss.item<float>();
}

std::vector<torch::Tensor> Trainer::parameter_copies() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> copies;
  for (const torch::Tensor& param : model_->parameters()) copies.push_back(param.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
  return copies;
}

std::size_t Trainer::model_data_bytes() {
  const bool chunked_adam = options_.optimizer == OptimizerKind::spillway_adam;
  std::size_t bytes = 0;
  for (const torch::Tensor& param : model_->parameters()) {
    if (!param.requires_grad()) {
      bytes += param.nbytes();
      continue;
    }
    bytes += 2 * param.nbytes();  // the parameter and its gradient
    if (chunked_adam) {
      const std::size_t fp32 = param.numel() * sizeof(float);
      bytes += 2 * fp32 + (param.scalar_type() == torch::kFloat ? 0 : fp32);
    }
  }
  return bytes;
}

}  // namespace spillway::train_demo
