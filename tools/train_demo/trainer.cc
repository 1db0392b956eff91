#include "tools/train_demo/trainer.h"

#include <optional>
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

torch::Tensor Trainer::loss_of(const Batch& batch) {
  // The loss in float whatever the model's dtype (a no-op for float).
  const torch::Tensor logits = model_->forward(batch.tokens.to(options_.device)).to(torch::kFloat);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, options_.model.vocab}),
                                              batch.targets.to(options_.device).reshape({-1}));
}

float Trainer::step() {
  std::vector<Batch> batches;
  for (int r = 0; r < options_.ranks; ++r)
    batches.push_back(task_.next_batch(options_.batch, options_.model.sequence));
  if (options_.mean_of_ranks) return step_mean_of_ranks(batches);
  optimizer_->zero_grad();
  const torch::Tensor loss = loss_of(batches[static_cast<std::size_t>(options_.rank)]);
  {
    std::optional<spillway::NoSync> after;
    if (options_.reduce_after_backward) after.emplace();
    loss.backward();  // reduces each chunk group as it completes, with a process group
  }
  spillway::reduce_gradients();  // what backward left
  optimizer_->step();
  spillway::step();
  return loss.item<float>();
}

float Trainer::step_mean_of_ranks(const std::vector<Batch>& batches) {
  const std::vector<torch::Tensor> params = model_->parameters();
  std::vector<torch::Tensor> sums(params.size());
  float first_loss = 0;
  for (std::size_t r = 0; r < batches.size(); ++r) {
    optimizer_->zero_grad();
    const torch::Tensor loss = loss_of(batches[r]);
    loss.backward();
    if (r == 0) first_loss = loss.item<float>();
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor grad = params[i].grad();
      if (!grad.defined()) continue;
      if (sums[i].defined())
        sums[i].add_(grad);
      else  // a rank before this one may not have reached it: zeros, as the reduction sends
        sums[i] = r == 0 ? grad.clone() : torch::zeros_like(grad).add_(grad);
    }
  }
  torch::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    torch::Tensor param = params[i];
    if (sums[i].defined())
      param.mutable_grad() = sums[i].div_(static_cast<double>(batches.size()));
    else
      param.mutable_grad().reset();
  }
  optimizer_->step();
  return first_loss;
}

std::size_t Trainer::optimizer_state_bytes() {
  if (auto* chunked = dynamic_cast<spillway::optim::ChunkedOptimizer*>(optimizer_.get())) {
    std::size_t bytes = 0;
    for (const torch::Tensor& param : model_->parameters()) {
      const auto state = chunked->param_state(param);
      if (!state.has_value() || !state->started) continue;
      for (const torch::Tensor& slot : state->slots) bytes += slot.nbytes();
    }
    return bytes;
  }
  std::size_t bytes = 0;
  for (const auto& [key, state] : optimizer_->state()) {
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state.get()))
      bytes += adam->exp_avg().nbytes() + adam->exp_avg_sq().nbytes();
  }
  return bytes;
}

std::vector<torch::Tensor> Trainer::parameter_copies() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> copies;
  for (const torch::Tensor& param : model_->parameters())
    copies.push_back(param.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
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
