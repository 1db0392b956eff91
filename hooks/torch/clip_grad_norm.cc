// spillway::clip_grad_norm_: torch's gradient clipping, by the norm of the
// mean gradient across data parallel ranks.
//
// Note [Clipping the mean gradient across ranks]
// Under data parallel training a rank holds the gradients it owns and no
// others (Note [Data parallel over chunk groups]), so torch's
// clip_grad_norm_ would see a different part of the gradient on each rank,
// take a different norm and clip each part by its own factor. Here the
// gradients are reduced first, each rank takes the norm of every gradient it
// holds as torch does (one per parameter, in the gradient's dtype), and the
// norms are made whole on every rank (Note [Per-parameter figures summed
// over owners]). Every rank then combines the same list of norms in
// parameter order with torch's own ops, so the total is bit for bit the one
// torch::nn::utils::clip_grad_norm_ computes in one process that holds the
// mean gradients, and each rank scales its own gradients by the same factor.
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

#include "hooks/torch/data_parallel.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway {

namespace {

// One gradient's norm, as torch's clip_grad_norm_ takes it.
at::Tensor gradient_norm(const at::Tensor& grad, double norm_type) {
  if (norm_type == std::numeric_limits<double>::infinity()) return grad.detach().abs().max();
  return grad.detach().norm(norm_type);
}

}  // namespace

double clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  if (data_parallel_world_size() == 1)
    return torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite);
  at::NoGradGuard no_grad;
  reduce_gradients(params);
  // Note [Clipping the mean gradient across ranks]
  std::vector<std::optional<double>> norms(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    norms[i] = norm_type == 0 ? 1.0 : gradient_norm(grad, norm_type).item<double>();
  }
  norms = torch_bridge::owned_figures_everywhere(std::move(norms), "gradient norms");

  std::vector<at::Tensor> present;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (norms[i].has_value())  // torch's: in the gradient's dtype, on its device
      present.push_back(at::scalar_tensor(
          *norms[i], at::TensorOptions(params[i].scalar_type()).device(params[i].device())));
  if (present.empty()) return 0.0;
  at::Tensor total;
  if (norm_type == std::numeric_limits<double>::infinity())
    total = present.size() == 1 ? present[0] : at::max(at::stack(present));
  else if (norm_type == 0)
    total = at::full({}, static_cast<double>(present.size()));
  else
    total = present.size() == 1 ? present[0] : at::stack(present).norm(norm_type);
  const double total_norm = total.item<double>();
  if (error_if_nonfinite && !std::isfinite(total_norm))
    throw std::runtime_error(
        "spillway::clip_grad_norm_: the total norm of the gradients is not finite, so it "
        "cannot be clipped (error_if_nonfinite)");
  const at::Tensor factor = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (const torch::Tensor& param : params)
    if (param.grad().defined()) param.grad().detach().mul_(factor);
  return total_norm;
}

}  // namespace spillway
