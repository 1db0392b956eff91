// A LibTorch user's program on the installed bridge (spillway::torch,
// hooks/torch/spillway_torch.h): trains a small MLP whose parameters,
// gradients and AdamW state live in spillway's chunks on the simulated device,
// under a budget that moves chunks every step, beside the same MLP under
// torch::optim::AdamW; the parameters agree within the chunked optimizers'
// tolerance (docs/optimizers.md). The C ABI (libspillway.so) sees the runtime
// the bridge configured: one runtime per process.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "allocator/spillway.h"
#include "hooks/torch/spillway_torch.h"

namespace {

constexpr int kSteps = 3;

int failed(const std::string& what) {
  std::printf("torch consumer: %s\n", what.c_str());
  return 1;
}

torch::nn::Sequential make_mlp() {
  torch::manual_seed(0);
  return torch::nn::Sequential(
      torch::nn::Linear(64, 512), torch::nn::Tanh(), torch::nn::Linear(512, 512), torch::nn::Tanh(),
      torch::nn::Linear(512, 512), torch::nn::Tanh(), torch::nn::Linear(512, 8));
}

// One figure of a flat JSON object of numbers, -1 when absent.
long long figure(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\":";
  const std::size_t at = json.find(quoted);
  return at == std::string::npos ? -1 : std::stoll(json.substr(at + quoted.size()));
}

// Max over all elements of |ours - theirs| / max(|theirs|, 1e-3). In slices
// of 64K elements: on the simulated device the check's temporaries count
// against the budget, and whole 1 MiB weights in double would take most of it.
double max_relative_difference(const std::vector<torch::Tensor>& ours,
                               const std::vector<torch::Tensor>& theirs) {
  constexpr std::int64_t kSlice = 1 << 16;
  torch::NoGradGuard no_grad;
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const torch::Tensor all_a = ours[i].detach().reshape({-1});
    const torch::Tensor all_b = theirs[i].detach().reshape({-1});
    for (std::int64_t start = 0; start < all_a.numel(); start += kSlice) {
      const std::int64_t end = std::min(start + kSlice, all_a.numel());
      const torch::Tensor a = all_a.slice(0, start, end).to(torch::kDouble);
      const torch::Tensor b = all_b.slice(0, start, end).to(torch::kDouble);
      worst = std::max(worst, ((a - b).abs() / b.abs().clamp_min(1e-3)).max().item<double>());
    }
  }
  return worst;
}

}  // namespace

int main() {
  // On the simulated device the budget also holds what torch allocates once
  // spillway is active (docs/torch-bridge.md, "Sim mode is a faithful GPU"):
  // autograd's fresh gradients each step (2.2 MiB) and the activations, beside
  // room for a few of the managed model's five chunks.
  const std::string conf =
      "device:sim,strict_residency:true,chunk_size:2MiB,device_budget:14MiB,sim_capacity:256MiB,"
      "policy:lru";
  torch::set_num_threads(1);
  spillway::configure(conf);
  torch::nn::Sequential reference = make_mlp();
  torch::nn::Sequential model = make_mlp();
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(1e-2);
  torch::manual_seed(1);
  const torch::Tensor inputs = torch::randn({kSteps, 16, 64});
  const torch::Tensor targets = torch::randn({kSteps, 16, 8});

  // The reference first, before spillway activates (at manage): its
  // gradients and AdamW state stay in torch's own memory, off the budget.
  torch::optim::AdamW torch_optimizer(reference->parameters(), options);
  for (int step = 0; step < kSteps; ++step) {
    torch_optimizer.zero_grad();
    torch::mse_loss(reference->forward(inputs[step]), targets[step]).backward();
    torch_optimizer.step();
  }

  spillway::manage(*model);
  spillway::optim::AdamW optimizer(model->parameters(), options);
  for (int step = 0; step < kSteps; ++step) {
    optimizer.zero_grad();
    torch::mse_loss(model->forward(inputs[step]), targets[step]).backward();
    optimizer.step();
    spillway::step();
  }
  const double difference = max_relative_difference(model->parameters(), reference->parameters());
  std::printf(
      "torch consumer: AdamW vs torch::optim::AdamW, %d steps: max relative difference %.3g\n",
      kSteps, difference);
  if (!(difference <= 1e-5)) return failed("the parameters differ from torch's");

  const std::string stats = spillway::memory_stats_json();
  if (stats.find("\"" + optimizer.client_name() + "\"") == std::string::npos) {
    return failed("no client " + optimizer.client_name() + " in " + stats);
  }
  if (figure(stats, "evictions") <= 0) return failed("no chunk moved: " + stats);

  // The C ABI reaches the same runtime: it is active, with this configuration.
  if (spillway_configure(conf.c_str()) != 0) return failed(spillway_last_error());
  if (spillway_configure("device:sim") == 0) return failed("the C ABI sees another runtime");
  std::string abi_stats(spillway_stats_json(nullptr, 0), '\0');
  spillway_stats_json(abi_stats.data(), abi_stats.size() + 1);
  if (figure(abi_stats, "evictions") != figure(stats, "evictions")) {
    return failed("the C ABI's statistics are another runtime's: " + abi_stats);
  }
  std::puts("installed spillway::torch works");
  return 0;
}
