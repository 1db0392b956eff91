// Note [set_data on a managed parameter]
// `param.data = t` (C++ set_data) or `param.set_(t)` points a managed
// parameter at another storage: torch's optimizers would then update bytes
// outside its chunk, and spillway's (which read the chunk) would update the
// old values. New data of the same shape, dtype and layout is copied into the
// chunk, and the parameter points at the chunk again, as manage() left it:
// right at the call for set_data (Note [set_data on a managed parameter, at
// the call], set_data_hook.cc), right after the op for set_ (Note [set_ on a
// managed parameter], op_hooks.cc), and, for a replacement neither saw, at
// the step boundary (spillway::step(), every Python optimizer's step) and at
// unmanage. Data of another shape or dtype cannot go in the chunk laid out
// for the old one: set_data refuses it before changing anything, and a
// replacement already made (set_) is an error at the step boundary; both
// name the parameter and the way out (unmanage, change the data, manage
// again), never a silent fork.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "hooks/torch/bridge.h"
#include "hooks/torch/client_names.h"

namespace spillway::torch_bridge {

bool same_layout(const at::TensorBase& a, const at::TensorBase& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.scalar_type() == b.scalar_type() && a.device() == b.device();
}

std::string describe_layout_change(ChunkManager& chunks, const ManagedParam& managed,
                                   const at::TensorBase& new_data) {
  const at::Tensor& bound = managed.bound_param;
  return fmt::format("managed parameter '{}' ({} {} -> {} {})",
                     tensor_name(chunks, managed.param_id), c10::toString(bound.scalar_type()),
                     fmt::join(bound.sizes(), "x"), c10::toString(new_data.scalar_type()),
                     fmt::join(new_data.sizes(), "x"));
}

void rebind_param_if_replaced(ChunkManager& chunks, ManagedParam& managed) {
  std::lock_guard lock(managed.grad_mutex);
  at::Tensor& param = managed.param;
  if (!param.has_storage() || managed.bound_param.storage().unsafeGetStorageImpl() ==
                                  param.storage().unsafeGetStorageImpl())
    return;
  if (!same_layout(param, managed.bound_param)) {
    throw std::runtime_error(fmt::format(
        "spillway: the data of {} was replaced (set_, or set_data where it was not seen) by a "
        "tensor of another shape, dtype, layout or device; its chunk holds the old layout. "
        "Unmanage the module, change the data, then manage it again",
        describe_layout_change(chunks, managed, param)));
  }
  void* address = nullptr;
  if (chunks.acquire(managed.param_id, Stream{}, &address, AccessMode::read_write,
                     WaitMode::host) != Status::ok)
    throw std::runtime_error("spillway: acquiring a parameter's chunk failed: " +
                             ChunkManager::last_error());
  {
    at::NoGradGuard no_grad;
    // Acquired above; and set_data's own op would reach the hook, which
    // takes grad_mutex, held here.
    OpHookSuppression suppress;
    managed.bound_param.copy_(param.detach());
    param.set_data(managed.bound_param);
  }
  chunks.release(managed.param_id, Stream{});
}

}  // namespace spillway::torch_bridge
