#include "hooks/torch/torch_sqrt.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>

namespace spillway::optim {

void torch_sqrt(const float* in, float* out, std::size_t count) {
  if (count == 0) return;
  c10::InferenceMode no_autograd;
  const auto n = static_cast<std::int64_t>(count);
  const at::Tensor input = at::from_blob(const_cast<float*>(in), {n}, at::kFloat);
  at::Tensor output = at::from_blob(out, {n}, at::kFloat);
  at::sqrt_out(output, input);
}

}  // namespace spillway::optim
