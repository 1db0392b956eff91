// Trainer: the demo's training loop (GPT on the Markov task), one step at a
// time, so that the demo, its check and the hook-overhead benchmark train the
// same way. The optimizer is chosen here and nowhere else (make_optimizer),
// so switching the demo to spillway's own optimizers is a one-place change.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tools/train_demo/gpt.h"
#include "tools/train_demo/markov_task.h"

namespace spillway::train_demo {

// torch_adam: torch::optim::Adam, its state in ordinary tensors.
// spillway_adam: spillway::optim::Adam (hooks/torch/optim.h), its state in
// chunks too; it manages the parameters itself.
enum class OptimizerKind { torch_adam, spillway_adam };

// "torch-adam", "spillway-adam" -> OptimizerKind; throws std::invalid_argument
// naming the accepted names otherwise.
OptimizerKind parse_optimizer(const std::string& name);
std::vector<std::string> optimizer_names();

struct TrainerOptions {
  GptConfig model;
  std::int64_t batch = 4;
  std::uint64_t seed = 0;  // the model's initial weights and the data stream
  OptimizerKind optimizer = OptimizerKind::torch_adam;
  double learning_rate = 3e-3;
  // Put the parameters and gradients into spillway's chunks (spillway::manage)
  // before the optimizer sees them.
  bool manage = false;
  // Parameters, gradients and activations in float or bfloat16. bf16 needs
  // spillway_adam, which keeps an fp32 master copy of each parameter (torch's
  // Adam would round every update to bf16); the loss is computed in float.
  torch::Dtype dtype = torch::kFloat;
  // Where the model and the batches live: the CPU (the simulated device's
  // memory when spillway manages them there) or a CUDA device.
  torch::Device device = torch::kCPU;
};

class Trainer {
 public:
  explicit Trainer(const TrainerOptions& options);

  // zero_grad, forward, cross-entropy loss, backward, optimizer step,
  // spillway::step(). Returns the loss.
  float step();

  Gpt& model() { return model_; }
  // Copies of the parameters, in named_parameters order (ordinary storage,
  // safe to keep after spillway moves or unmanages the originals).
  std::vector<torch::Tensor> parameter_copies();
  // What spillway keeps in chunks: parameters and gradients, and with
  // spillway_adam the optimizer's two fp32 state tensors per parameter (and
  // an fp32 master copy of a bf16 parameter).
  std::size_t model_data_bytes();

 private:
  TrainerOptions options_;
  Gpt model_{nullptr};
  MarkovTask task_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

}  // namespace spillway::train_demo
