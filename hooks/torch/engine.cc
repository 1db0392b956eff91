#include "hooks/torch/engine.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hooks/torch/spillway_torch.h"

namespace spillway {
namespace {

std::unique_ptr<optim::ChunkedOptimizer> make_optimizer(std::vector<torch::Tensor> params,
                                                        const engine::OptimizerConfig& config) {
  switch (config.type) {
    case engine::OptimizerType::adam:
      return std::make_unique<optim::Adam>(std::move(params),
                                           torch::optim::AdamOptions(config.lr)
                                               .betas({config.beta1, config.beta2})
                                               .eps(config.eps)
                                               .weight_decay(config.weight_decay));
    case engine::OptimizerType::adamw:
      return std::make_unique<optim::AdamW>(std::move(params),
                                            torch::optim::AdamWOptions(config.lr)
                                                .betas({config.beta1, config.beta2})
                                                .eps(config.eps)
                                                .weight_decay(config.weight_decay));
    case engine::OptimizerType::sgd:
      return std::make_unique<optim::SGD>(std::move(params),
                                          torch::optim::SGDOptions(config.lr)
                                              .momentum(config.momentum)
                                              .dampening(config.dampening)
                                              .nesterov(config.nesterov)
                                              .weight_decay(config.weight_decay));
  }
  throw std::invalid_argument("engine config: optimizer.type: unsupported");
}

}  // namespace

EngineCore::EngineCore(torch::nn::Module& module, engine::EngineConfig config)
    : config_(std::move(config)), scaler_(config_.loss_scaler) {
  if (config_.spillway_conf) configure(*config_.spillway_conf);
  if (config_.precision != engine::Precision::f32) module.to(compute_dtype());
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    named.emplace_back(item.key(), item.value());
  take_parameters(std::move(named));
}

EngineCore::EngineCore(std::vector<std::pair<std::string, torch::Tensor>> named_params,
                       engine::EngineConfig config)
    : config_(std::move(config)), scaler_(config_.loss_scaler) {
  for (const auto& [name, param] : named_params) {
    if (param.defined() && param.is_floating_point() && param.scalar_type() != compute_dtype())
      throw std::invalid_argument("initialize: parameter '" + name + "' is " +
                                  std::string(c10::toString(param.scalar_type())) +
                                  " where the configuration computes in " +
                                  std::string(c10::toString(compute_dtype())));
  }
  if (config_.spillway_conf) configure(*config_.spillway_conf);
  take_parameters(std::move(named_params));
}

EngineCore::EngineCore(std::vector<std::pair<std::string, torch::Tensor>> named_params,
                       engine::EngineConfig config, optim::ChunkedOptimizer& optimizer)
    : config_(std::move(config)), scaler_(config_.loss_scaler), optimizer_(&optimizer) {
  if (config_.spillway_conf) configure(*config_.spillway_conf);
  manage(std::move(named_params));
}

void EngineCore::take_parameters(std::vector<std::pair<std::string, torch::Tensor>> named_params) {
  std::vector<torch::Tensor> trainable;
  for (const auto& [name, param] : named_params)
    if (param.defined() && param.requires_grad()) trainable.push_back(param);
  if (trainable.empty())
    throw std::invalid_argument("initialize: the model has no parameter that requires grad");
  manage(std::move(named_params));
  owned_optimizer_ = make_optimizer(std::move(trainable), config_.optimizer);
  optimizer_ = owned_optimizer_.get();
}

torch::Dtype EngineCore::compute_dtype() const {
  switch (config_.precision) {
    case engine::Precision::fp16:
      return torch::kHalf;
    case engine::Precision::bf16:
      return torch::kBFloat16;
    case engine::Precision::f32:
      break;
  }
  return torch::kFloat;
}

bool EngineCore::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % static_cast<std::uint64_t>(config_.gradient_accumulation_steps) == 0;
}

void EngineCore::zero_grad() { optimizer_->zero_grad(); }

std::vector<double> EngineCore::get_lr() const {
  std::vector<double> lrs;
  for (const auto& group : optimizer_->param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

void EngineCore::backward(const torch::Tensor& loss) {
  // Scaled in fp32: an fp16 loss times 2^16 could overflow before backward.
  const double factor = (config_.precision == engine::Precision::fp16 ? scaler_.scale() : 1.0) /
                        config_.gradient_accumulation_steps;
  if (factor == 1.0) {
    loss.backward();
  } else {
    (loss.to(torch::kFloat) * factor).backward();
  }
}

bool EngineCore::step() {
  step_applied_ = false;
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (!boundary) return false;

  const bool fp16 = config_.precision == engine::Precision::fp16;
  const double unscale = fp16 ? 1.0 / scaler_.scale() : 1.0;
  double grad_scale = unscale;
  bool overflow = false;
  if (fp16 || config_.gradient_clipping > 0) {
    const optim::GradientSummary summary = optimizer_->gradient_summary(unscale);
    overflow = fp16 && summary.found_inf;
    last_norm_ = summary.global_norm;
    // torch.nn.utils.clip_grad_norm_'s factor, applied only when it shrinks.
    if (!overflow && config_.gradient_clipping > 0) {
      const double clip = config_.gradient_clipping / (summary.global_norm + 1e-6);
      if (clip < 1.0) grad_scale *= clip;
    }
  }
  if (overflow) {
    ++skipped_steps_;
  } else {
    optimizer_->step_scaled(grad_scale);
  }
  step_applied_ = !overflow;
  if (fp16) scaler_.update(overflow);
  optimizer_->zero_grad();
  ++global_steps_;
  global_samples_ += static_cast<std::uint64_t>(config_.train_batch_size.value_or(0));
  spillway::step();  // the iteration boundary, for the trace and the planner
  return step_applied_;
}

void EngineCore::save_state(torch::serialize::OutputArchive& archive) const {
  auto counter = [](std::uint64_t value) {
    return torch::tensor(static_cast<std::int64_t>(value), torch::kInt64);
  };
  archive.write("micro_steps", counter(micro_steps_));
  archive.write("global_steps", counter(global_steps_));
  archive.write("global_samples", counter(global_samples_));
  archive.write("skipped_steps", counter(skipped_steps_));
  archive.write("last_gradient_norm", torch::tensor(last_norm_, torch::kFloat64));
  const engine::LossScaler::State scaler = scaler_.state();
  archive.write("loss_scaler",
                torch::tensor({scaler.scale, static_cast<double>(scaler.hysteresis_left),
                               static_cast<double>(scaler.iteration),
                               static_cast<double>(scaler.last_overflow_iteration),
                               static_cast<double>(scaler.overflows)},
                              torch::kFloat64));
}

void EngineCore::load_state(torch::serialize::InputArchive& archive) {
  auto counter = [&](const char* key) {
    torch::Tensor value;
    archive.read(key, value);
    return static_cast<std::uint64_t>(value.item<std::int64_t>());
  };
  micro_steps_ = counter("micro_steps");
  global_steps_ = counter("global_steps");
  global_samples_ = counter("global_samples");
  skipped_steps_ = counter("skipped_steps");
  torch::Tensor norm, scaler;
  archive.read("last_gradient_norm", norm);
  last_norm_ = norm.item<double>();
  archive.read("loss_scaler", scaler);
  if (scaler.numel() != 5)
    throw std::invalid_argument("engine checkpoint: loss_scaler holds " +
                                std::to_string(scaler.numel()) + " values, expected 5");
  const auto* v = scaler.data_ptr<double>();
  scaler_.set_state({v[0], static_cast<int>(v[1]), static_cast<std::int64_t>(v[2]),
                     static_cast<std::int64_t>(v[3]), static_cast<std::uint64_t>(v[4])});
}

}  // namespace spillway
