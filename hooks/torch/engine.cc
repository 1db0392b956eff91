#include "hooks/torch/engine.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <sys/stat.h>

#include "hooks/engine/gradient_clipping.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/sim_torch_allocator.h"
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

// What DeepSpeed would have done with zero_optimization and the keys without
// effect, and what spillway does instead: once per engine, on stderr (a
// configuration's promises are not a debugging detail).
void report_deepspeed_mapping(const engine::EngineConfig& config) {
  std::string text_lines = engine::describe_deepspeed_mapping(config);
  while (!text_lines.empty() && text_lines.back() == '\n') text_lines.pop_back();
  if (!text_lines.empty()) fmt::print(stderr, "spillway.initialize: {}\n", text_lines);
}

// DeepSpeed's fp32 clip_grad_norm_ (runtime/utils.py): each gradient's
// float32 L2 norm, stacked, squared, summed and raised to 1/2, with torch's
// own kernels in the same order, so the global norm (and so the clipping
// factor) is DeepSpeed's to the bit. Parameters without a gradient are left
// out, as there. Under data parallel training each gradient's norm comes
// from its owner (Note [Per-parameter figures summed over owners]), so the
// norm is that of the mean gradient, the same on every rank.
double deepspeed_fp32_global_norm(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<std::optional<double>> owned(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& grad = params[i].grad();
    if (grad.defined()) owned[i] = grad.detach().to(torch::kFloat).norm(2).item<double>();
  }
  owned = torch_bridge::owned_figures_everywhere(std::move(owned), "gradient norms");
  std::vector<torch::Tensor> norms;
  for (const std::optional<double>& norm : owned)
    if (norm.has_value()) norms.push_back(torch::scalar_tensor(*norm, torch::kFloat));
  if (norms.empty()) return 0;
  return torch::stack(norms).square().sum().to(torch::kFloat).pow(1.0 / 2.0).item<double>();
}

// The parameters an optimizer steps, in the module's order.
std::vector<torch::Tensor> trainable_of(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params) {
  std::vector<torch::Tensor> trainable;
  for (const auto& [name, param] : named_params)
    if (param.defined() && param.requires_grad()) trainable.push_back(param);
  return trainable;
}

// A group's momentum setting: Adam's and AdamW's {beta1, beta2}, SGD's
// {momentum}; empty for other options.
std::vector<double> momentum_of(const torch::optim::OptimizerOptions& options) {
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options))
    return {sgd->momentum()};
  if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options))
    return {std::get<0>(adam->betas()), std::get<1>(adam->betas())};
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options))
    return {std::get<0>(adamw->betas()), std::get<1>(adamw->betas())};
  return {};
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
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
  trainable_ = trainable_of(named_params);
  manage(std::move(named_params));
  start_lr_schedule();
  report_deepspeed_mapping(config_);
}

void EngineCore::take_parameters(std::vector<std::pair<std::string, torch::Tensor>> named_params) {
  trainable_ = trainable_of(named_params);
  if (trainable_.empty())
    throw std::invalid_argument("initialize: the model has no parameter that requires grad");
  manage(std::move(named_params));
  owned_optimizer_ = make_optimizer(trainable_, config_.optimizer);
  optimizer_ = owned_optimizer_.get();
  start_lr_schedule();
  report_deepspeed_mapping(config_);
}

namespace {

// A group's own settings as the schedule reads them: its starting lr, and
// whether it has betas (Adam, AdamW) and which.
engine::OptimizerConfig group_settings(const torch::optim::OptimizerParamGroup& group) {
  engine::OptimizerConfig settings;
  settings.lr = group.options().get_lr();
  const std::vector<double> momentum = momentum_of(group.options());
  if (momentum.size() == 2) {  // the schedule treats Adam and AdamW alike
    settings.type = engine::OptimizerType::adam;
    settings.beta1 = momentum[0];
    settings.beta2 = momentum[1];
  } else {
    settings.type = engine::OptimizerType::sgd;
  }
  return settings;
}

void set_betas(torch::optim::OptimizerOptions& options, const engine::AdamBetas& betas) {
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({betas.beta1, betas.beta2});
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas({betas.beta1, betas.beta2});
  }
}

}  // namespace

void EngineCore::start_lr_schedule() {
  if (!config_.scheduler) return;
  for (const auto& group : optimizer_->param_groups())
    schedules_.emplace_back(*config_.scheduler, group_settings(group));
  apply_lr_schedule();
}

void EngineCore::apply_lr_schedule() {
  auto& groups = optimizer_->param_groups();
  for (std::size_t i = 0; i < schedules_.size() && i < groups.size(); ++i) {
    groups[i].options().set_lr(schedules_[i].lr());
    if (schedules_[i].betas()) set_betas(groups[i].options(), *schedules_[i].betas());
  }
}

std::vector<std::vector<double>> EngineCore::group_momentum() const {
  std::vector<std::vector<double>> momentum;
  for (const auto& group : optimizer_->param_groups())
    momentum.push_back(momentum_of(group.options()));
  return momentum;
}

std::optional<long long> EngineCore::lr_schedule_iteration() const {
  if (schedules_.empty()) return std::nullopt;
  return schedules_.front().last_batch_iteration();
}

void EngineCore::step_lr_schedule() {
  for (engine::LrSchedule& schedule : schedules_) schedule.step();
  apply_lr_schedule();
}

void EngineCore::restore_lr_schedule(long long last_batch_iteration) {
  if (schedules_.empty())
    throw std::invalid_argument("engine: restore_lr_schedule without a configured scheduler");
  for (engine::LrSchedule& schedule : schedules_) schedule.restore(last_batch_iteration);
  apply_lr_schedule();
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
  const auto start = std::chrono::steady_clock::now();
  // Scaled in fp32: an fp16 loss times 2^16 could overflow before backward.
  const double factor = (config_.precision == engine::Precision::fp16 ? scaler_.scale() : 1.0) /
                        config_.gradient_accumulation_steps;
  // Within an accumulation window only the last backward reduces across
  // ranks (Note [Reducing while backward runs]).
  std::optional<NoSync> accumulating;
  if (!is_gradient_accumulation_boundary()) accumulating.emplace();
  if (factor == 1.0) {
    loss.backward();
  } else {
    (loss.to(torch::kFloat) * factor).backward();
  }
  const double elapsed = milliseconds_since(start);
  micro_times_.backward_ms += elapsed;
  window_times_.backward_ms += elapsed;
}

void EngineCore::add_forward_time(double milliseconds) {
  micro_times_.forward_ms += milliseconds;
  window_times_.forward_ms += milliseconds;
}

bool EngineCore::step() {
  const auto start = std::chrono::steady_clock::now();
  step_applied_ = false;
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  if (!boundary) {
    report_progress(false, milliseconds_since(start));
    return false;
  }

  // Data parallel: each owner's gradients become the mean over the ranks
  // before anything looks at them; backward reduced them already, unless
  // it reached a model only in earlier micro-batches (nothing without a group).
  reduce_gradients(trainable_);
  const bool fp16 = config_.precision == engine::Precision::fp16;
  const engine::ClipPath path = engine::clip_path(config_.precision, config_.zero.stage);
  // fp16 and ZeRO's paths take the norm of the gradients as stored (still
  // scaled); fp32 and bf16's the true norm (hooks/engine/gradient_clipping.h).
  const bool scaled_norm = path == engine::ClipPath::fp16 || path == engine::ClipPath::zero;
  const double loss_scale = fp16 ? scaler_.scale() : 1.0;
  double grad_scale = 1.0 / loss_scale;
  bool overflow = false;
  if (path == engine::ClipPath::fp32 && config_.gradient_clipping > 0) {
    // The norm as DeepSpeed's clip_grad_norm_ takes it, so the factor is its.
    last_norm_ = deepspeed_fp32_global_norm(trainable_);
    grad_scale =
        engine::deepspeed_gradient_factor(path, last_norm_, config_.gradient_clipping, 1.0);
  } else if (fp16 || config_.gradient_clipping > 0) {
    const optim::GradientSummary summary =
        optimizer_->gradient_summary(scaled_norm ? 1.0 : 1.0 / loss_scale);
    overflow = fp16 && summary.found_inf;
    last_norm_ = scaled_norm ? summary.global_norm / loss_scale : summary.global_norm;
    // DeepSpeed takes the norm as a float32 tensor's item().
    const double norm = static_cast<float>(summary.global_norm);
    if (!overflow)
      grad_scale =
          engine::deepspeed_gradient_factor(path, norm, config_.gradient_clipping, loss_scale);
  }
  if (overflow) {
    ++skipped_steps_;
  } else {
    optimizer_->step_scaled(grad_scale);
    step_lr_schedule();  // DeepSpeed steps its scheduler after applied steps only
  }
  step_applied_ = !overflow;
  if (fp16) scaler_.update(overflow);
  optimizer_->zero_grad();
  ++global_steps_;
  global_samples_ += static_cast<std::uint64_t>(config_.train_batch_size.value_or(0));
  spillway::step();  // the iteration boundary, for the trace and the planner
  report_progress(true, milliseconds_since(start));
  return step_applied_;
}

void EngineCore::report_progress(bool boundary, double step_ms) {
  micro_times_.step_ms += step_ms;
  window_times_.step_ms += step_ms;
  if (config_.wall_clock_breakdown) {
    fmt::print("{}\n", engine::timers_line(micro_times_, /*micro=*/true));
    if (boundary) fmt::print("{}\n", engine::timers_line(window_times_, /*micro=*/false));
    std::fflush(stdout);
  }
  micro_times_ = {};
  if (boundary) window_times_ = {};
  // DeepSpeed reports before counting the step: step (global_steps + 1)
  // when it is a multiple of steps_per_print; here global_steps_ has counted it.
  if (!boundary || !config_.steps_per_print || global_steps_ % *config_.steps_per_print != 0)
    return;
  engine::GroupMomentum momentum;
  momentum.sgd = dynamic_cast<const torch::optim::SGDOptions*>(
                     &optimizer_->param_groups().front().options()) != nullptr;
  for (const std::vector<double>& group : group_momentum()) {
    if (group.size() == 1) momentum.momentum.push_back(group[0]);
    if (group.size() == 2) momentum.betas.emplace_back(group[0], group[1]);
  }
  fmt::print(stderr, "{}\n",
             engine::progress_line(global_steps_, skipped_steps_, get_lr(), momentum));
}

EngineCore::State EngineCore::state() const {
  return {micro_steps_,   global_steps_, global_samples_,
          skipped_steps_, last_norm_,    scaler_.state()};
}

void EngineCore::set_state(const State& state) {
  scaler_.set_state(state.loss_scaler);  // checks it first
  micro_steps_ = state.micro_steps;
  global_steps_ = state.global_steps;
  global_samples_ = state.global_samples;
  skipped_steps_ = state.skipped_steps;
  last_norm_ = state.last_gradient_norm;
}

void EngineCore::save_state(torch::serialize::OutputArchive& archive) const {
  const State state = this->state();
  auto counter = [](std::uint64_t value) {
    return torch::tensor(static_cast<std::int64_t>(value), torch::kInt64);
  };
  archive.write("micro_steps", counter(state.micro_steps));
  archive.write("global_steps", counter(state.global_steps));
  archive.write("global_samples", counter(state.global_samples));
  archive.write("skipped_steps", counter(state.skipped_steps));
  archive.write("last_gradient_norm", torch::tensor(state.last_gradient_norm, torch::kFloat64));
  const engine::LossScaler::State& scaler = state.loss_scaler;
  archive.write("loss_scaler",
                torch::tensor({scaler.scale, static_cast<double>(scaler.hysteresis_left),
                               static_cast<double>(scaler.iteration),
                               static_cast<double>(scaler.last_overflow_iteration),
                               static_cast<double>(scaler.overflows)},
                              torch::kFloat64));
  archive.write("lr_schedule_iteration",
                torch::tensor(static_cast<std::int64_t>(lr_schedule_iteration().value_or(-2)),
                              torch::kInt64));
}

void EngineCore::load_state(torch::serialize::InputArchive& archive) {
  auto counter = [&](const char* key) {
    torch::Tensor value;
    archive.read(key, value);
    return static_cast<std::uint64_t>(value.item<std::int64_t>());
  };
  State state;
  state.micro_steps = counter("micro_steps");
  state.global_steps = counter("global_steps");
  state.global_samples = counter("global_samples");
  state.skipped_steps = counter("skipped_steps");
  torch::Tensor norm, scaler;
  archive.read("last_gradient_norm", norm);
  state.last_gradient_norm = norm.item<double>();
  archive.read("loss_scaler", scaler);
  if (scaler.numel() != 5)
    throw std::invalid_argument("engine checkpoint: loss_scaler holds " +
                                std::to_string(scaler.numel()) + " values, expected 5");
  const auto* v = scaler.data_ptr<double>();
  state.loss_scaler = {v[0], static_cast<int>(v[1]), static_cast<std::int64_t>(v[2]),
                       static_cast<std::int64_t>(v[3]), static_cast<std::uint64_t>(v[4])};
  set_state(state);
  // -2: saved without a scheduler.
  torch::Tensor iteration;
  archive.read("lr_schedule_iteration", iteration);
  const long long saved = iteration.item<std::int64_t>();
  if ((saved == -2) != schedules_.empty())
    throw std::invalid_argument(std::string("engine checkpoint: saved ") +
                                (saved == -2 ? "without" : "with") +
                                " a learning-rate scheduler, loaded into an engine " +
                                (schedules_.empty() ? "without" : "with") + " one");
  if (saved != -2) restore_lr_schedule(saved);
}

namespace {

// Note [No std::filesystem beside libtorch]
// libtorch.so exports std::filesystem symbols of its own build, and the
// dynamic linker may bind ours to them: remove_all crashed that way. Paths
// here use POSIX calls instead.
std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() || a.back() == '/' ? a + b : a + "/" + b;
}

bool is_regular_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// mkdir -p.
void make_directories(const std::string& path) {
  for (std::size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string prefix = slash == std::string::npos ? path : path.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw std::runtime_error("engine save_checkpoint: cannot create " + prefix + ": " +
                               std::strerror(errno));
    if (slash == std::string::npos) return;
  }
}

std::string model_states_path(const std::string& dir, const std::string& tag) {
  return join_path(join_path(dir, tag), "mp_rank_00_model_states.pt");
}

std::string optim_states_path(const std::string& dir, const std::string& tag,
                              engine::Precision precision) {
  const char* prefix = precision == engine::Precision::bf16 ? "bf16_" : "";
  return join_path(join_path(dir, tag),
                   std::string(prefix) + "zero_pp_rank_0_mp_rank_00_optim_states.pt");
}

// Written beside, then renamed: no half-written checkpoint under its name.
template <typename Write>
void write_atomically(const std::string& path, Write write) {
  const std::string partial = path + ".partial";
  write(partial);
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    throw std::runtime_error("engine save_checkpoint: cannot rename " + partial + " to " + path +
                             ": " + std::strerror(errno));
}

void require_file(const std::string& path) {
  if (!is_regular_file(path))
    throw std::runtime_error("engine load_checkpoint: " + path + " does not exist");
}

// The module's parameters and buffers by name.
std::vector<std::pair<std::string, torch::Tensor>> module_tensors(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    tensors.emplace_back(item.key(), item.value());
  return tensors;
}

}  // namespace

void EngineCore::save_checkpoint(torch::nn::Module& module, const std::string& dir, std::string tag,
                                 bool save_latest) {
  if (tag.empty()) tag = "global_step" + std::to_string(global_steps_);
  make_directories(join_path(dir, tag));
  // A checkpoint's copies are host data, off the device budget.
  torch_bridge::HostWorkScope host;
  c10::Dict<std::string, at::Tensor> values;
  {
    torch::NoGradGuard no_grad;
    // A copy is an op: a spilled chunk is fetched (raw storage reads are not).
    for (const auto& [name, tensor] : module_tensors(module))
      values.insert(name, tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
  }
  const bool sharded = config_.zero.stage > 0;
  write_atomically(model_states_path(dir, tag), [&](const std::string& path) {
    torch::serialize::OutputArchive archive;
    archive.write("module", c10::IValue(values));
    torch::serialize::OutputArchive engine_state;
    save_state(engine_state);
    archive.write("engine", engine_state);
    if (!sharded) {
      torch::serialize::OutputArchive optimizer;
      optimizer_->save(optimizer);
      archive.write("optimizer", optimizer);
    }
    archive.save_to(path);
  });
  if (sharded) {
    write_atomically(optim_states_path(dir, tag, config_.precision), [&](const std::string& path) {
      torch::serialize::OutputArchive archive;
      optimizer_->save(archive);
      archive.save_to(path);
    });
  }
  if (save_latest) {
    write_atomically(join_path(dir, "latest"), [&](const std::string& path) {
      std::ofstream latest(path, std::ios::trunc);
      latest << tag;
      if (!latest.flush()) throw std::runtime_error("engine save_checkpoint: cannot write " + path);
    });
  }
}

std::string EngineCore::load_checkpoint(torch::nn::Module& module, const std::string& dir,
                                        std::string tag) {
  if (tag.empty()) {
    const std::string latest = join_path(dir, "latest");
    require_file(latest);
    std::ifstream file(latest);
    std::getline(file, tag);
    if (tag.empty()) throw std::runtime_error("engine load_checkpoint: " + latest + " is empty");
  }
  const std::string path = model_states_path(dir, tag);
  require_file(path);
  torch_bridge::HostWorkScope host;  // what is read is host data, off the device budget
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  c10::IValue saved;
  archive.read("module", saved);
  const c10::Dict<std::string, at::Tensor> values =
      c10::impl::toTypedDict<std::string, at::Tensor>(saved.toGenericDict());
  const auto tensors = module_tensors(module);
  for (const auto& [name, tensor] : tensors) {
    if (!values.contains(name))
      throw std::invalid_argument("engine load_checkpoint: " + path + " has no '" + name + "'");
    if (values.at(name).sizes() != tensor.sizes())
      throw std::invalid_argument("engine load_checkpoint: '" + name + "' is " +
                                  c10::str(values.at(name).sizes()) + " in " + path +
                                  ", the module's is " + c10::str(tensor.sizes()));
  }
  if (values.size() != tensors.size())
    throw std::invalid_argument("engine load_checkpoint: " + path + " holds " +
                                std::to_string(values.size()) + " tensors, the module " +
                                std::to_string(tensors.size()));
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, tensor] : tensors) tensor.copy_(values.at(name));  // an op: fetched
  }
  if (config_.zero.stage > 0) {
    const std::string optim_path = optim_states_path(dir, tag, config_.precision);
    require_file(optim_path);
    torch::serialize::InputArchive optimizer;
    optimizer.load_from(optim_path);
    optimizer_->load(optimizer);
  } else {
    torch::serialize::InputArchive optimizer;
    archive.read("optimizer", optimizer);
    optimizer_->load(optimizer);
  }
  torch::serialize::InputArchive engine_state;
  archive.read("engine", engine_state);
  load_state(engine_state);
  return path;
}

}  // namespace spillway
