// Note [A parameter only the bridge holds goes]
// The bridge holds every managed parameter (ManagedParam::param, and its
// gradient accumulator holds it too), a tensor over its bound storage, its
// bound gradient, and both storages, so that no tensor ever points into a
// chunk that is gone. Without more, a module destroyed without unmanage
// would keep its chunks for the life of the process. So the bridge counts
// references: a parameter whose TensorImpl, storage and gradient are held by
// the bridge's own references and nothing else can never be read again: its
// module destroyed, its optimizer gone, no view of its data, no autograd
// graph that saved it or leads to its gradient accumulator, no Python object
// of it that Python code holds (torch's PyObject preservation keeps one alive
// for C++, which counts). Its tensors are discarded from their chunks without
// a copy, its storages are detached from chunk memory, and a client with
// nothing left bound goes with its chunks. Anything else that holds it keeps
// it managed, with its values.
//
// The bridge sweeps at its own entry points, never from an op: step() (every
// Python optimizer's step calls it), manage, unmanage and memory_stats_json.
// A C++ program that destroys a model without calling any of them keeps its
// chunks until it does. A parameter whose storage was replaced and not
// rebound (set_ with data of another layout) is left to the step boundary
// (Note [set_data on a managed parameter]).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "hooks/torch/bridge.h"
#include "hooks/torch/held_only_by.h"

namespace spillway::torch_bridge {
namespace {

// Note [A parameter only the bridge holds goes]: the references counted are
// exactly the bridge's own.
bool only_the_bridge_holds(const ManagedParam& managed) {
  const at::Tensor& param = managed.param;
  if (!param.defined() || !param.has_storage() || !managed.bound_param.defined()) return false;
  c10::StorageImpl* storage = managed.bound_param.storage().unsafeGetStorageImpl();
  if (param.storage().unsafeGetStorageImpl() != storage) return false;  // set_data replaced it
  // ManagedParam::param, and the AccumulateGrad node's variable. The node is
  // the bridge's alone, or an autograd graph (whose backward accumulates into
  // the parameter's gradient) still leads to it.
  if (managed.grad_accumulator != nullptr && managed.grad_accumulator.use_count() != 1)
    return false;
  if (!held_only_by(param.unsafeGetTensorImpl(), managed.grad_accumulator != nullptr ? 2 : 1))
    return false;
  // bound_param is a TensorImpl of its own; the storage is the Binding's,
  // the parameter's and bound_param's.
  if (!held_only_by(managed.bound_param.unsafeGetTensorImpl(), 1) || !held_only_by(storage, 3))
    return false;
  if (managed.bound_grad.defined()) {
    const at::Tensor& grad = param.grad();  // a reference: a copy would count
    const bool grad_is_bound = grad.defined() && grad.is_same(managed.bound_grad);
    if (grad.defined() && !grad_is_bound) return false;  // a replacement someone may hold
    // bound_grad, and the parameter's grad field when it is the bound one.
    if (!held_only_by(managed.bound_grad.unsafeGetTensorImpl(), grad_is_bound ? 2 : 1))
      return false;
    // The Binding and the bound gradient.
    if (managed.bound_grad_storage != nullptr && !held_only_by(managed.bound_grad_storage, 2))
      return false;
  }
  return true;
}

// The storage's tensor goes from its chunk, and the storage from chunk memory.
bool forget_storage(ChunkManager& chunks, c10::StorageImpl* storage) {
  const std::optional<Binding> binding = binding_table().find(storage);
  if (!binding) return true;
  if (chunks.discard(binding->tensor) != Status::ok) return false;
  binding_table().erase(storage);
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, binding->device));
  storage->set_nbytes(0);
  return true;
}

}  // namespace

void drop_unreachable_params(ChunkManager& chunks) {
  if (binding_table().empty()) return;
  std::unordered_set<std::uint32_t> touched_clients;
  for (const std::shared_ptr<ManagedParam>& managed : binding_table().managed_params()) {
    if (!only_the_bridge_holds(*managed)) continue;
    stop_rebinding_after_accumulation(*managed);
    // The gradient first: the parameter's binding is what lists it. A
    // discard that fails (the tensor is acquired) leaves the rest bound for
    // the next sweep; a gradient already forgotten is not looked at again.
    if (managed->bound_grad_storage != nullptr) {
      if (!forget_storage(chunks, managed->bound_grad_storage)) continue;
      managed->bound_grad_storage = nullptr;
    }
    if (!forget_storage(chunks, managed->bound_param.storage().unsafeGetStorageImpl())) continue;
    // A gradient registered but never bound (no backward reached it) was
    // never acquired: it holds nothing.
    touched_clients.insert(static_cast<std::uint32_t>(managed->client));
    managed->bound_grad = at::Tensor();
    managed->bound_param = at::Tensor();
    managed->param = at::Tensor();  // the last reference: the parameter goes
  }
  remove_clients_without_bindings(chunks, touched_clients);
}

}  // namespace spillway::torch_bridge
