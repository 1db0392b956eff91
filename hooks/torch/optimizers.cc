// Adam, AdamW and SGD over ChunkedOptimizer: torch's options, checked as
// torch checks them, turned into the kernels' configs. The machinery they
// share (placement, where updates run, save / load) is in
// chunked_optimizer.cc.
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "hooks/torch/optim.h"
#include "hooks/torch/torch_parallel_for.h"
#include "hooks/torch/torch_sqrt.h"
#if SPILLWAY_HAVE_OPTIM_CUDA
#include "hooks/optim/cuda_kernels.h"
#endif

namespace spillway::optim {

namespace {

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("spillway::optim::" + message);
}

template <class Options>
void check_adam_options(const char* kind, const Options& o) {
  require(o.lr() >= 0, std::string(kind) + ": invalid learning rate " + std::to_string(o.lr()));
  require(o.eps() >= 0, std::string(kind) + ": invalid epsilon " + std::to_string(o.eps()));
  const auto [beta1, beta2] = o.betas();
  require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
          std::string(kind) + ": invalid betas (" + std::to_string(beta1) + ", " +
              std::to_string(beta2) + ")");
  require(o.weight_decay() >= 0,
          std::string(kind) + ": invalid weight_decay " + std::to_string(o.weight_decay()));
  require(!o.amsgrad(), std::string(kind) + ": amsgrad is not supported");
}

void check_sgd_options(const torch::optim::SGDOptions& o) {
  require(o.lr() >= 0, "SGD: invalid learning rate " + std::to_string(o.lr()));
  require(o.momentum() >= 0, "SGD: invalid momentum " + std::to_string(o.momentum()));
  require(o.weight_decay() >= 0, "SGD: invalid weight_decay " + std::to_string(o.weight_decay()));
  require(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
          "SGD: nesterov momentum requires a momentum and zero dampening");
}

// Every group's options (groups without options of their own get the
// defaults when the base constructor adds them).
template <class Options, class Check>
void check_groups(const std::vector<torch::optim::OptimizerParamGroup>& groups, Check check) {
  for (const auto& group : groups) check(static_cast<const Options&>(group.options()));
}

template <class Options>
cpu::AdamConfig adam_config(const Options& o, bool decoupled, bool first_moment_by_lerp,
                            std::int64_t step, float grad_scale) {
  cpu::AdamConfig config;
  config.first_moment_by_lerp = first_moment_by_lerp;
  config.lr = o.lr();
  config.beta1 = std::get<0>(o.betas());
  config.beta2 = std::get<1>(o.betas());
  config.eps = o.eps();
  config.weight_decay = o.weight_decay();
  config.decoupled_weight_decay = decoupled;
  config.step = step;
  config.grad_scale = grad_scale;
  // Bit for bit as torch::optim::Adam on the CPU (Note [Square roots from
  // torch]); the CUDA kernels take sqrtf, correctly rounded as torch's are.
  config.sqrt = &torch_sqrt;
  return config;
}

#if SPILLWAY_HAVE_OPTIM_CUDA
template <class Arrays, class Config>
void launch(bool (*kernel)(const Arrays&, const Config&, void*, std::string*), const Arrays& arrays,
            const Config& config, void* stream) {
  std::string error;
  if (!kernel(arrays, config, stream, &error))
    throw std::runtime_error("spillway optim: CUDA kernel: " + error);
}
#else
[[noreturn]] void no_cuda_kernels() {
  throw std::runtime_error(
      "spillway optim: a parameter is on a CUDA device, but spillway was built without the CUDA "
      "optimizer kernels");
}
#endif

}  // namespace

// Adam and AdamW share one kernel; only the weight decay differs.
template <class Options>
static void run_adam(const Options& o, bool decoupled, bool first_moment_by_lerp,
                     const cpu::AdamArrays& arrays, std::int64_t step, float grad_scale, bool cuda,
                     void* stream) {
  const cpu::AdamConfig config = adam_config(o, decoupled, first_moment_by_lerp, step, grad_scale);
  if (!cuda) return cpu::adam_step(arrays, config, torch_exec_config());
#if SPILLWAY_HAVE_OPTIM_CUDA
  launch(&cuda::adam_step, arrays, config, stream);
#else
  (void)stream;
  no_cuda_kernels();
#endif
}

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> groups,
           torch::optim::AdamOptions defaults)
    : ChunkedOptimizer(std::move(groups),
                       std::make_unique<torch::optim::AdamOptions>(std::move(defaults)), "adam") {
  check_adam_options("Adam", static_cast<const torch::optim::AdamOptions&>(this->defaults()));
  check_groups<torch::optim::AdamOptions>(param_groups_,
                                          [](const auto& o) { check_adam_options("Adam", o); });
  place_all();
}

Adam::Adam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults)
    : Adam(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
               std::move(params))},
           std::move(defaults)) {}

int Adam::state_slots(const torch::optim::OptimizerOptions&) const { return 2; }

void Adam::run_update(const torch::optim::OptimizerOptions& options, const Update& u, Target target,
                      void* cuda_stream) const {
  const auto& o = static_cast<const torch::optim::AdamOptions&>(options);
  check_adam_options("Adam", o);  // options may have changed since construction
  const cpu::AdamArrays arrays{u.count,    u.params,   u.grads,      u.grad_dtype,
                               u.state[0], u.state[1], u.params_low, u.params_low_dtype};
  run_adam(o, /*decoupled=*/false, first_moment_by_lerp_, arrays, u.step, u.grad_scale,
           target == Target::cuda, cuda_stream);
}

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
             torch::optim::AdamWOptions defaults)
    : ChunkedOptimizer(std::move(groups),
                       std::make_unique<torch::optim::AdamWOptions>(std::move(defaults)), "adamw") {
  check_adam_options("AdamW", static_cast<const torch::optim::AdamWOptions&>(this->defaults()));
  check_groups<torch::optim::AdamWOptions>(param_groups_,
                                           [](const auto& o) { check_adam_options("AdamW", o); });
  place_all();
}

AdamW::AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults)
    : AdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
                std::move(params))},
            std::move(defaults)) {}

int AdamW::state_slots(const torch::optim::OptimizerOptions&) const { return 2; }

void AdamW::run_update(const torch::optim::OptimizerOptions& options, const Update& u,
                       Target target, void* cuda_stream) const {
  const auto& o = static_cast<const torch::optim::AdamWOptions&>(options);
  check_adam_options("AdamW", o);
  const cpu::AdamArrays arrays{u.count,    u.params,   u.grads,      u.grad_dtype,
                               u.state[0], u.state[1], u.params_low, u.params_low_dtype};
  run_adam(o, /*decoupled=*/true, first_moment_by_lerp_, arrays, u.step, u.grad_scale,
           target == Target::cuda, cuda_stream);
}

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults)
    : ChunkedOptimizer(std::move(groups),
                       std::make_unique<torch::optim::SGDOptions>(std::move(defaults)), "sgd") {
  check_sgd_options(static_cast<const torch::optim::SGDOptions&>(this->defaults()));
  check_groups<torch::optim::SGDOptions>(param_groups_,
                                         [](const auto& o) { check_sgd_options(o); });
  place_all();
}

SGD::SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults)
    : SGD(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(
              std::move(params))},
          std::move(defaults)) {}

// The momentum buffer exists once momentum is used, as in torch.
int SGD::state_slots(const torch::optim::OptimizerOptions& options) const {
  return static_cast<const torch::optim::SGDOptions&>(options).momentum() != 0 ? 1 : 0;
}

void SGD::run_update(const torch::optim::OptimizerOptions& options, const Update& u, Target target,
                     void* cuda_stream) const {
  const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
  check_sgd_options(o);
  cpu::SgdConfig config;
  config.lr = o.lr();
  config.momentum = o.momentum();
  config.dampening = o.dampening();
  config.nesterov = o.nesterov();
  config.weight_decay = o.weight_decay();
  config.first_step = u.state_fresh;  // torch starts the buffer as the first gradient
  config.grad_scale = u.grad_scale;
  const cpu::SgdArrays arrays{u.count,    u.params,     u.grads,           u.grad_dtype,
                              u.state[0], u.params_low, u.params_low_dtype};
  if (target == Target::cpu) return cpu::sgd_step(arrays, config, torch_exec_config());
#if SPILLWAY_HAVE_OPTIM_CUDA
  launch(&cuda::sgd_step, arrays, config, cuda_stream);
#else
  (void)cuda_stream;
  no_cuda_kernels();
#endif
}

}  // namespace spillway::optim
