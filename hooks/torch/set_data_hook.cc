// set_data on a managed parameter, seen as it happens.
//
// `param.set_data(t)` (Python `param.data = t`, torch.nn.Module._apply, the
// C++ Module::to) is not a dispatched op: TensorBase::set_data calls torch's
// VariableHooksInterface directly, so the op hooks never see it. The bridge
// therefore puts its own VariableHooksInterface in front of torch's, once per
// process (at activation), forwarding every call and looking at set_data.
//
// Note [set_data on a managed parameter, at the call]
// For a managed parameter still bound to its chunk:
//  - new data of the same layout (sizes, strides, dtype, device) goes into
//    the chunk right after torch's set_data, and the parameter points at the
//    chunk again (rebind_param_if_replaced), so no op ever runs on the new
//    storage outside the budget, with or without a step boundary;
//  - new data of another layout is refused before anything changes, with an
//    error naming the parameter and the way out: the chunk is laid out for
//    the old one. (`model.double()` on a managed model raises at its first
//    parameter and leaves the model as it was.)
// Like torch's, the new storage is not shared with the parameter afterwards
// (writes to `t` do not reach it): its values were copied in. The step
// boundary and unmanage still check (Note [set_data on a managed parameter]
// in param_rebinding.cc), for a replacement this hook did not see.
#include <memory>
#include <stdexcept>
#include <string>

#include <ATen/core/VariableHooksInterface.h>
#include <fmt/format.h>

#include "hooks/torch/bridge.h"
#include "hooks/torch/torch_allocator_compat.h"

namespace spillway::torch_bridge {

namespace {

void refuse_another_layout(ChunkManager& chunks, const ManagedParam& managed,
                           const at::TensorBase& new_data) {
  if (same_layout(new_data, managed.bound_param)) return;
  throw std::runtime_error(fmt::format(
      "spillway: set_data (or `param.data = ...`, or a module's .to()/.double()/.half()) on {} "
      "with a tensor of another shape, dtype, layout or device; its chunk holds the old layout, "
      "and nothing was changed. Unmanage the module, change the data, then manage it again",
      describe_layout_change(chunks, managed, new_data)));
}

// Forwards to torch's own hooks; set_data as in the Note above.
class RebindingVariableHooks final : public at::impl::VariableHooksInterface {
 public:
  explicit RebindingVariableHooks(at::impl::VariableHooksInterface* torch_hooks)
      : torch_(torch_hooks) {}

  void set_data(const at::TensorBase& self, const at::TensorBase& new_data) const override {
    const std::shared_ptr<ManagedParam> managed = managed_param_bound_to(self);
    if (managed == nullptr) return torch_->set_data(self, new_data);
    ChunkManager& chunks = active_chunk_manager();
    refuse_another_layout(chunks, *managed, new_data);
    torch_->set_data(self, new_data);
    rebind_param_if_replaced(chunks, *managed);
  }

  at::TensorBase tensor_data(const at::TensorBase& self) const override {
    return torch_->tensor_data(self);
  }
  at::TensorBase variable_data(const at::TensorBase& self) const override {
    return torch_->variable_data(self);
  }
  const std::shared_ptr<torch::autograd::Node>& grad_fn(const at::TensorBase& self) const override {
    return torch_->grad_fn(self);
  }
  unsigned _register_hook(
      const at::TensorBase& self,
      std::function<at::TensorBase(const at::TensorBase&)> hook) const override {
    return torch_->_register_hook(self, std::move(hook));
  }
  void remove_hook(const at::TensorBase& self, unsigned pos) const override {
    torch_->remove_hook(self, pos);
  }
  bool is_view(const at::TensorBase& self) const override { return torch_->is_view(self); }
  const at::TensorBase& base(const at::TensorBase& self) const override {
    return torch_->base(self);
  }
  const std::string& name(const at::TensorBase& self) const override { return torch_->name(self); }
  bool is_leaf(const at::TensorBase& self) const override { return torch_->is_leaf(self); }
  int64_t output_nr(const at::TensorBase& self) const override { return torch_->output_nr(self); }
  at::TensorBase data(const at::TensorBase& self) const override { return torch_->data(self); }
  int64_t _version(const at::TensorBase& self) const override { return torch_->_version(self); }
  void retain_grad(const at::TensorBase& self) const override { torch_->retain_grad(self); }
  bool retains_grad(const at::TensorBase& self) const override {
    return torch_->retains_grad(self);
  }
  void _backward(const at::Tensor& self, at::TensorList inputs,
                 const std::optional<at::Tensor>& gradient, std::optional<bool> keep_graph,
                 bool create_graph) const override {
    torch_->_backward(self, inputs, gradient, keep_graph, create_graph);
  }
  void requires_grad_(const at::TensorBase& self, bool requires_grad) const override {
    torch_->requires_grad_(self, requires_grad);
  }
  void basic_autograd_not_implemented_fallback(const c10::OperatorHandle& op,
                                               c10::DispatchKeySet dispatch_keys,
                                               torch::jit::Stack* stack) const override {
    torch_->basic_autograd_not_implemented_fallback(op, dispatch_keys, stack);
  }
#if SPILLWAY_TORCH_AT_LEAST(2, 10)  // grad_dtype came in torch 2.10
  std::optional<c10::ScalarType> grad_dtype(const at::TensorBase& self) const override {
    return torch_->grad_dtype(self);
  }
  void set_grad_dtype(const at::TensorBase& self,
                      const std::optional<c10::ScalarType>& dtype) const override {
    torch_->set_grad_dtype(self, dtype);
  }
#endif

 private:
  at::impl::VariableHooksInterface* torch_;
};

}  // namespace

void install_set_data_hook() {
  if (!at::impl::HasVariableHooks())
    throw std::runtime_error(
        "spillway: torch's autograd has not registered its variable hooks (libtorch's autograd "
        "is not loaded), so set_data on a managed parameter could not be followed");
  // Never destroyed: torch keeps the pointer for the life of the process.
  static auto* const hooks = new RebindingVariableHooks(at::impl::GetVariableHooks());
  at::impl::SetVariableHooks(hooks);
}

}  // namespace spillway::torch_bridge
