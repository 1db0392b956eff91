// optim.h: spillway's chunked optimizers, Adam, AdamW and SGD (design
// section 6), built the PyTorch way: from parameters or
// parameter groups and torch's own option types, never from a model.
//
// Design summary:
//  - Each optimizer is a torch::optim::Optimizer (param_groups(), zero_grad(),
//    add_param_group() as usual) and a chunk-manager client of its own
//    ("adam#0", "sgd#1", ...). Its state (exp_avg, exp_avg_sq,
//    momentum_buffer; TensorKind::optimizer_state) and, for bf16/fp16
//    parameters, an fp32 master copy (TensorKind::master) live in its chunks,
//    so they move and spill like parameters do. Parameters not yet managed
//    are managed (spillway::manage) when the optimizer first sees them.
//  - step() updates each parameter where its chunk is now: a host-resident
//    one with the SIMD CPU kernel (hooks/optim/cpu_kernels.h) on host copies;
//    a device-resident one on the device (the CPU kernel on the sim device's
//    memory, a CUDA kernel on a GPU), unless its state cannot join it there
//    within the budget, in which case on the host.
//  - Mixed precision: a bf16/fp16 parameter is updated in fp32 on its master
//    copy from its low-precision gradient, and written back in the same pass.
//  - Note [Chunked optimizer state is not in state()]: the state lives in
//    chunks, not in torch's state() map, which stays empty; save() / load()
//    write and read it.
//
// See docs/optimizers.md ("Chunked optimizers") for what is not supported.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "hooks/optim/cpu_kernels.h"

namespace spillway::optim {

struct GradientSummary {
  double global_norm = 0;  // L2 norm over every gradient, scaled as asked
  bool found_inf = false;  // some gradient element is +-inf or NaN
};

// Where updates ran, per parameter and step, and how many kernel calls they
// took: one per run of back-to-back parameters (Note [One kernel call per
// run] in chunked_optimizer.cc). For tests and tuning.
struct UpdatePlacement {
  std::int64_t host = 0;
  std::int64_t device = 0;
  std::int64_t kernel_calls = 0;
};

class ChunkedOptimizer : public torch::optim::Optimizer {
 public:
  ~ChunkedOptimizer() override;

  // One pass over the gradients of every parameter that has one, in all
  // groups, as stored (fp32, bf16 or fp16) times grad_scale: the global norm
  // for clipping and the overflow check for dynamic loss scaling.
  GradientSummary gradient_summary(double grad_scale = 1.0);

  // step_scaled(1.0), after running the closure (with grad mode on) if given.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // One step with every gradient multiplied by grad_scale first (1/loss_scale
  // times a clip factor), without touching the stored gradients. Parameters
  // whose gradient is undefined are skipped, as torch does.
  void step_scaled(double grad_scale);

  // The groups' options, and per parameter its step count, state and fp32
  // master copy. Loading into a fresh optimizer over parameters of the same
  // shapes, in the same order, continues bit-identically.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // One parameter's state, as copies (torch-style state dicts: the Python
  // package). `slots` are the state arrays, flat fp32 over the parameter's
  // whole storage, in slot order (Adam: exp_avg, exp_avg_sq; SGD:
  // momentum_buffer); `master` is the fp32 master copy of a bf16/fp16
  // parameter, undefined otherwise.
  struct ParamState {
    std::int64_t step = 0;
    bool started = false;  // the state has been updated at least once
    std::vector<torch::Tensor> slots;
    // A low-precision parameter's fp32 master copy; undefined for one not
    // yet stepped whose values this rank dropped (dist_params:sharded).
    torch::Tensor master;
  };
  // Empty when the optimizer holds no state for `param` (not in its groups,
  // or frozen).
  std::optional<ParamState> param_state(const torch::Tensor& param) const;
  // Writes `state` into the chunks (a master copy also rounds into the
  // parameter). Throws std::invalid_argument when `param` is not held, when a
  // tensor's element count differs from the parameter's storage, or when
  // there are more slots than the options need.
  void set_param_state(const torch::Tensor& param, const ParamState& state);

  // The chunk-manager client holding the state, e.g. "adam#0".
  const std::string& client_name() const;
  UpdatePlacement placement() const;

 protected:
  // What one update works on, wherever it runs: one parameter's arrays, or a
  // run of parameters laid back to back in all of them. `state` has
  // state_slots() arrays; `params` is the fp32 parameter or master copy.
  struct Update {
    std::size_t count = 0;
    float* params = nullptr;
    const void* grads = nullptr;
    cpu::DType grad_dtype = cpu::DType::f32;
    float* state[2] = {nullptr, nullptr};
    void* params_low = nullptr;
    cpu::DType params_low_dtype = cpu::DType::bf16;
    float grad_scale = 1.0f;
    std::int64_t step = 1;     // the parameters' step number, 1-based
    bool state_fresh = false;  // the state has never been updated before
  };
  enum class Target { cpu, cuda };

  ChunkedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                   std::unique_ptr<torch::optim::OptimizerOptions> defaults, std::string kind);
  // Manages the parameters and places their state; called by the derived
  // constructor, once the virtuals below answer.
  void place_all();

  // State arrays a parameter needs under these options (at most 2).
  virtual int state_slots(const torch::optim::OptimizerOptions& options) const = 0;
  // Runs the update. Target::cuda: the pointers are device memory and the
  // kernel is queued on cuda_stream.
  virtual void run_update(const torch::optim::OptimizerOptions& options, const Update& update,
                          Target target, void* cuda_stream) const = 0;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// torch::optim::Adam's options; amsgrad is not supported.
class Adam final : public ChunkedOptimizer {
 public:
  Adam(std::vector<torch::optim::OptimizerParamGroup> groups,
       torch::optim::AdamOptions defaults = {});
  Adam(std::vector<torch::Tensor> params, torch::optim::AdamOptions defaults = {});

  // Round exp_avg as torch.optim.Adam (Python) does, not as torch::optim::Adam
  // (cpu::AdamConfig::first_moment_by_lerp); the Python package sets it.
  // Call before the first step.
  void set_first_moment_by_lerp(bool by_lerp) { first_moment_by_lerp_ = by_lerp; }

 private:
  bool first_moment_by_lerp_ = false;
  int state_slots(const torch::optim::OptimizerOptions& options) const override;
  void run_update(const torch::optim::OptimizerOptions& options, const Update& update,
                  Target target, void* cuda_stream) const override;
};

// torch::optim::AdamW's options (decoupled weight decay); amsgrad is not supported.
class AdamW final : public ChunkedOptimizer {
 public:
  AdamW(std::vector<torch::optim::OptimizerParamGroup> groups,
        torch::optim::AdamWOptions defaults = {});
  AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults = {});

  // As Adam::set_first_moment_by_lerp (torch.optim.AdamW is Python's Adam).
  void set_first_moment_by_lerp(bool by_lerp) { first_moment_by_lerp_ = by_lerp; }

 private:
  bool first_moment_by_lerp_ = false;
  int state_slots(const torch::optim::OptimizerOptions& options) const override;
  void run_update(const torch::optim::OptimizerOptions& options, const Update& update,
                  Target target, void* cuda_stream) const override;
};

// torch::optim::SGD's options: momentum, dampening, nesterov, weight decay.
class SGD final : public ChunkedOptimizer {
 public:
  SGD(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions defaults);
  SGD(std::vector<torch::Tensor> params, torch::optim::SGDOptions defaults);

 private:
  int state_slots(const torch::optim::OptimizerOptions& options) const override;
  void run_update(const torch::optim::OptimizerOptions& options, const Update& update,
                  Target target, void* cuda_stream) const override;
};

}  // namespace spillway::optim
