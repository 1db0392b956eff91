// Gradient binding: param.grad is a tensor in a grad chunk, so autograd
// accumulates into chunk memory in place.
//
// Note [Why a bound gradient accumulates in place]
// torch's AccumulateGrad, when param.grad is defined and grad mode is off (a
// plain backward), runs `variable_grad += new_grad`, an in-place add_ whose op
// hook acquires the grad chunk for writing. Only an undefined param.grad makes
// autograd create a tensor of its own (stealing or cloning the incoming
// gradient).
//
// Note [Set-to-none zero_grad]
// Setting param.grad to none undoes the binding; the next backward then gives
// param.grad a fresh tensor. The bridge notices at the next opportunity (the
// op hook, when an op uses the parameter, e.g. the optimizer's update; or
// spillway::step()) and copies the fresh gradient into the grad chunk, binding
// the chunk tensor again. Values are the same, so results are too; the cost is
// one copy per step.
//
// Note [A gradient is undefined until a backward defines it]
// manage() registers the grad chunk but leaves an undefined param.grad
// undefined, as torch does: optimizers skip a parameter without a gradient
// (no weight decay, no momentum), so a parameter that a step does not reach
// must not get a zero gradient from spillway. The first backward that reaches
// it gives it a fresh tensor, which is bound as after a set-to-none zero_grad.
// A gradient already defined at manage() is copied into the chunk and bound
// at once.
//
// Note [A replaced gradient someone holds keeps its values]
// The bound gradient is copied over only when nothing but the bridge holds
// it. After `g = p.grad; opt.zero_grad(); loss.backward()`, torch leaves g
// with the old values and gives p.grad a fresh tensor; copying the fresh one
// into the chunk would change g under its holder. So while g is held the
// fresh gradient stays p.grad, outside the chunk (memory no eviction frees),
// and the first rebinding after g is let go moves it in.
//
// Note [Binding right after accumulation]
// Left to the next op that uses the parameter, a fresh gradient (the first
// backward's, and every one after a set-to-none zero_grad, torch 2's default)
// would stay outside its chunk until the optimizer runs: every gradient of
// the model at once, as memory no chunk eviction can free. So manage() puts a
// post hook on each parameter's gradient accumulator (the AccumulateGrad
// node, which the bridge keeps alive so that every backward uses it): right
// after autograd stores the gradient, the hook copies it into the chunk and
// binds the chunk tensor, and the fresh one is freed. At most one gradient
// is outside its chunk at a time. A node post hook, not
// register_post_accumulate_grad_hook, whose one slot belongs to Python hooks.
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include "hooks/torch/bridge.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/torch_out_of_memory.h"

namespace spillway::torch_bridge {

namespace {

// A tensor with the parameter's sizes, strides and offset over a storage of
// the parameter's storage size, pointing at the grad tensor's chunk address.
at::Tensor make_chunk_grad(ChunkManager& chunks, const ManagedParam& managed) {
  const at::Tensor& param = managed.param;
  const c10::StorageImpl& param_storage = *param.storage().unsafeGetStorageImpl();
  const c10::Device device = param_storage.data_ptr().device();
  const std::optional<TensorInfo> info = chunks.tensor_info(managed.grad_id);
  if (!info) throw std::runtime_error("spillway: the gradient's chunk tensor is unknown");
  auto storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), param_storage.nbytes(),
      at::DataPtr(info->address, device), /*allocator=*/nullptr, /*resizable=*/false);
  at::NoGradGuard no_grad;
  OpHookSuppression suppress;  // the storage is not bound yet: nothing to acquire
  at::Tensor grad = at::empty({0}, param.options().requires_grad(false));
  grad.set_(c10::Storage(std::move(storage)), param.storage_offset(), param.sizes(),
            param.strides());
  return grad;
}

// Copies `values` into the bound gradient, its chunk acquired for writing.
void copy_into_bound_grad(ChunkManager& chunks, ManagedParam& managed, const at::Tensor& values) {
  void* address = nullptr;
  const Status status =
      chunks.acquire(managed.grad_id, Stream{}, &address, AccessMode::read_write, WaitMode::host);
  if (status == Status::out_of_memory)
    throw_chunk_out_of_memory("acquiring a gradient's chunk", ChunkManager::last_error());
  if (status != Status::ok)
    throw std::runtime_error("spillway: acquiring a gradient's chunk failed: " +
                             ChunkManager::last_error());
  {
    at::NoGradGuard no_grad;
    OpHookSuppression suppress;  // acquired above
    managed.bound_grad.copy_(values);
  }
  chunks.release(managed.grad_id, Stream{});
}

}  // namespace

void bind_grad(ChunkManager& chunks, ManagedParam& managed) {
  std::lock_guard lock(managed.grad_mutex);
  managed.bound_grad = make_chunk_grad(chunks, managed);
  c10::StorageImpl* storage = managed.bound_grad.storage().unsafeGetStorageImpl();
  managed.bound_grad_storage = storage;
  binding_table().insert(Binding{managed.grad_id, TensorKind::grad,
                                 c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage),
                                 storage->data_ptr().device(), nullptr});
  // The chunk may have moved between tensor_info and insert: point the
  // storage at the current address (Note [Lock order]: no table lock held).
  if (const std::optional<TensorInfo> info = chunks.tensor_info(managed.grad_id))
    point_storage_at(*storage, info->address, storage->data_ptr().device());
  // Note [A gradient is undefined until a backward defines it].
  const at::Tensor existing = managed.param.grad();
  if (!existing.defined()) return;
  copy_into_bound_grad(chunks, managed, existing);
  managed.param.mutable_grad() = managed.bound_grad;
}

namespace {

// Autograd gave param.grad a tensor of its own (Note [Set-to-none zero_grad]).
bool gradient_is_fresh(ManagedParam& managed) {
  std::lock_guard lock(managed.grad_mutex);
  return managed.bound_grad.defined() && managed.param.grad().defined() &&
         !grad_is_bound_locked(managed);
}

class RebindAfterAccumulation final : public torch::autograd::FunctionPostHook {
 public:
  explicit RebindAfterAccumulation(std::weak_ptr<ManagedParam> managed)
      : managed_(std::move(managed)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (const std::shared_ptr<ManagedParam> managed = managed_.lock()) {
      {
        std::lock_guard lock(managed->grad_mutex);
        check_not_accumulating_onto_reduced(*managed);
      }
      managed->gradient_unreduced.store(true, std::memory_order_release);
      ChunkManager& chunks = active_chunk_manager();
      if (gradient_is_fresh(*managed))
        discard_dead_gradients_once_per_step(chunks, managed->client,
                                             DeadGradientCheck::first_fresh_gradient);
      rebind_grad_if_replaced(chunks, *managed);
      reduce_as_backward_completes(*managed);
    }
    return outputs;
  }

 private:
  std::weak_ptr<ManagedParam> managed_;  // the node must not keep it alive
};

}  // namespace

void rebind_after_accumulation(const std::shared_ptr<ManagedParam>& managed) {
  if (!managed->param.requires_grad() || !managed->param.is_leaf()) return;
  managed->grad_accumulator = torch::autograd::impl::grad_accumulator(managed->param);
  if (managed->grad_accumulator == nullptr) return;
  managed->rebind_hook_key =
      managed->grad_accumulator->add_post_hook(std::make_unique<RebindAfterAccumulation>(managed));
}

void stop_rebinding_after_accumulation(ManagedParam& managed) {
  if (managed.grad_accumulator == nullptr) return;
  managed.grad_accumulator->del_post_hook(managed.rebind_hook_key);
  managed.grad_accumulator.reset();
}

bool grad_is_bound_locked(const ManagedParam& managed) {
  const at::Tensor& grad = managed.param.grad();  // a reference: a copy would count
  return grad.defined() && grad.has_storage() &&
         grad.storage().unsafeGetStorageImpl() == managed.bound_grad_storage;
}

void rebind_grad_if_replaced(ChunkManager& chunks, ManagedParam& managed) {
  std::lock_guard lock(managed.grad_mutex);
  if (!managed.bound_grad.defined()) return;  // a frozen parameter: no grad chunk
  const at::Tensor current = managed.param.grad();
  if (!current.defined()) return;  // set to none and no backward since
  if (grad_is_bound_locked(managed)) return;
  if (current.sizes() != managed.bound_grad.sizes() ||
      current.scalar_type() != managed.bound_grad.scalar_type() || current.is_sparse())
    return;  // not a gradient the chunk can hold: left as it is
  // Note [A replaced gradient someone holds keeps its values].
  if (!only_the_bridge_holds_bound_grad(managed)) return;
  discard_gradient_if_dead_locked(chunks, managed);  // Note [A gradient set to none is not fetched]
  copy_into_bound_grad(chunks, managed, current);
  managed.param.mutable_grad() = managed.bound_grad;
}

}  // namespace spillway::torch_bridge
