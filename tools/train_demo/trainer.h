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
  // Data parallel (docs/data-parallel.md): each step draws `ranks`
  // micro-batches of `batch` sequences from the one stream, in rank order.
  // A rank trains micro-batch `rank`, reducing gradients across the ranks
  // (spillway's process group) before the optimizer step. With
  // `mean_of_ranks`, one process trains all of them instead, as the
  // reference: each micro-batch's gradient on its own, summed in rank order
  // and divided by `ranks`, which is what spillway's reduction computes.
  int ranks = 1;
  int rank = 0;
  bool mean_of_ranks = false;
  // Reduce after backward (backward inside spillway::NoSync, then
  // reduce_gradients) instead of during it, each chunk group as its
  // gradients complete: bench/dp's comparison.
  bool reduce_after_backward = false;
};

class Trainer {
 public:
  explicit Trainer(const TrainerOptions& options);

  // zero_grad, forward, cross-entropy loss, backward, the gradients' reduction
  // across ranks (nothing without a process group), optimizer step,
  // spillway::step(). Returns the loss of this rank's micro-batch (rank 0's
  // with mean_of_ranks).
  float step();

  Gpt& model() { return model_; }
  // Copies of the parameters, in named_parameters order (ordinary storage,
  // safe to keep after spillway moves or unmanages the originals).
  std::vector<torch::Tensor> parameter_copies();
  // What spillway keeps in chunks: parameters and gradients, and with
  // spillway_adam the optimizer's two fp32 state tensors per parameter (and
  // an fp32 master copy of a bf16 parameter).
  std::size_t model_data_bytes();
  // Bytes of optimizer state this process holds: tensors in torch's
  // optimizer's state, or spillway's optimizer's state chunks that hold
  // bytes. Under data parallel training, about 1/ranks of the model's.
  std::size_t optimizer_state_bytes();

 private:
  TrainerOptions options_;
  Gpt model_{nullptr};
  MarkovTask task_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;

  float step_mean_of_ranks(const std::vector<Batch>& batches);
  torch::Tensor loss_of(const Batch& batch);
};

}  // namespace spillway::train_demo
