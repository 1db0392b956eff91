// bridge.h: the torch bridge's shared state, private to hooks/torch.
//
// Note [Bindings are keyed by StorageImpl]
// A managed tensor is known by its c10::StorageImpl*, which every view and
// every autograd saved variable shares and which does not change when the
// bridge rebinds the data pointer. The op hook looks each tensor input up by
// it: one hash lookup per input.
//
// Note [Lock order]
// The binding table's lock is never held while calling the chunk manager. The
// chunk manager calls the table's observer with its own lock held, and the
// observer takes the table's lock (shared): so holding the table lock across a
// chunk-manager call could deadlock.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/torch.h>

#include "allocator/chunk/chunk_manager.h"
#include "allocator/chunk/chunk_observer.h"
#include "allocator/runtime.h"

namespace spillway::torch_bridge {

// A parameter under management, with the chunk-resident gradient bound to it.
struct ManagedParam {
  ClientId client{};
  at::Tensor param;  // the leaf variable (holds it alive while managed)
  TensorId param_id{};
  // A tensor over the chunk-backed storage manage() bound, with the
  // parameter's layout: param's data unless set_data replaced it (Note
  // [set_data on a managed parameter]).
  at::Tensor bound_param;
  at::Tensor bound_grad;  // chunk-resident; param.grad() unless autograd replaced it
  TensorId grad_id{};
  // requires_grad was false at manage(), and no grad chunk or accumulation
  // hook has been given since (Note [A parameter unfrozen after manage()] in
  // manage.cc).
  std::atomic<bool> without_gradient{false};
  c10::StorageImpl* bound_grad_storage = nullptr;
  std::mutex grad_mutex;  // serialises rebinding of this parameter's gradient
  // Note [Binding right after accumulation] (grad_binding.cc): the
  // parameter's gradient accumulator, kept alive, and the key of our post
  // hook on it.
  std::shared_ptr<torch::autograd::Node> grad_accumulator;
  std::uintptr_t rebind_hook_key = 0;
  // Set by every accumulation into the gradient (and at manage()), cleared
  // when the gradient is reduced across ranks: Note [A reduction reduces
  // what backward wrote since the last] (data_parallel.cc).
  std::atomic<bool> gradient_unreduced{true};
  // The owner's gradient as the last reduction left it, and its version
  // then: Note [A backward onto a reduced gradient] (data_parallel.cc).
  // Weak, so that its address is not reused while we compare it. Guarded by
  // grad_mutex.
  c10::weak_intrusive_ptr<c10::TensorImpl> reduced_grad{c10::intrusive_ptr<c10::TensorImpl>()};
  std::uint32_t reduced_grad_version = 0;
  // With dist_params:sharded, for a parameter its owner steps: the index of
  // its chunk group in its model's layout (else -1); whether the group is
  // dropped (every rank but the owner dropped its bytes), so that an op
  // gathers it first; and when an op last used it. The same on every rank:
  // Note [Parameters gathered for their use] (sharded_params.cc).
  std::atomic<std::int32_t> shard_group{-1};
  std::atomic<bool> shard_dropped{false};
  std::atomic<bool> shard_owned{false};  // this rank owns it
  std::atomic<std::uint64_t> last_use{0};
};

// What the op hook needs to know about one managed storage.
struct Binding {
  TensorId tensor{};
  TensorKind kind = TensorKind::param;
  c10::intrusive_ptr<c10::StorageImpl> storage;  // kept alive while bound
  c10::Device device{c10::kCPU};
  // For a parameter's storage: its ManagedParam (for lazy gradient rebinding).
  std::shared_ptr<ManagedParam> managed;
};

struct TensorIdHash {
  std::size_t operator()(TensorId id) const noexcept {
    return std::hash<std::uint64_t>{}(static_cast<std::uint64_t>(id));
  }
};

// Every managed storage, and the chunk observer that rebinds them.
class BindingTable final : public ChunkObserver {
 public:
  // False fast, with no lookup, while nothing is managed.
  bool empty() const { return size_.load(std::memory_order_acquire) == 0; }

  // Copy of the binding of `storage`, if managed.
  std::optional<Binding> find(const c10::StorageImpl* storage) const;
  bool contains(const c10::StorageImpl* storage) const { return find(storage).has_value(); }

  void insert(Binding binding);
  // The binding removed, if there was one.
  std::optional<Binding> erase(const c10::StorageImpl* storage);
  // Every ManagedParam (for step()).
  std::vector<std::shared_ptr<ManagedParam>> managed_params() const;

  // ChunkObserver: points each moved tensor's storage at its new address.
  void on_tensors_moved(std::span<const TensorAddress> tensors) override;

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, Binding> by_storage_;
  std::unordered_map<TensorId, c10::StorageImpl*, TensorIdHash> by_tensor_;
  std::atomic<std::size_t> size_{0};
};

// Points `storage` at `address` without owning it (chunk memory).
void point_storage_at(c10::StorageImpl& storage, void* address, c10::Device device);

// The process's bridge state; created on first use, never destroyed (Note [The
// process runtime lives forever] in allocator/runtime.h applies here too).
BindingTable& binding_table();

// The managed parameter whose TensorImpl `tensor` is, while its storage is the
// chunk-bound one; null otherwise (another tensor over it, or set_data/set_
// gave it another storage).
std::shared_ptr<ManagedParam> managed_param_bound_to(const at::TensorBase& tensor);

// The process's chunk manager, activating spillway if needed; throws
// std::runtime_error when activation fails. Installs the observer and the op
// hooks on first call.
ChunkManager& active_chunk_manager();

// Installs the global RecordFunction callback (once; op_hooks.cc).
void install_op_hooks();

// Where an op on `device` acquires its managed inputs (Note [The op's
// stream] in op_hooks.cc): on CUDA the current stream, which waits for a
// fetch; on the CPU the host, which blocks for it.
struct OpStream {
  Stream stream;
  WaitMode wait = WaitMode::host;
};
OpStream op_stream(c10::Device device);
// Puts the bridge's variable hooks in front of torch's, so set_data on a
// managed parameter is followed at the call (set_data_hook.cc). Once.
void install_set_data_hook();

// While alive, the op hook ignores ops on this thread: for the bridge's own
// ops on tensors it has acquired itself.
class OpHookSuppression {
 public:
  OpHookSuppression();
  ~OpHookSuppression();
  OpHookSuppression(const OpHookSuppression&) = delete;
  OpHookSuppression& operator=(const OpHookSuppression&) = delete;
  static bool active();

 private:
  bool previous_;
};

// Copies `bytes` between two addresses the device can reach (chunk memory,
// tensors' memory), waiting until done. Throws std::runtime_error on failure.
void copy_bytes(void* dst, const void* src, std::size_t bytes);

// Note [A parameter only the bridge holds goes] (dropped_params.cc):
// discards from their chunks, without a copy, the parameters and gradients
// nothing but the bridge holds any more, and removes the clients left with
// nothing bound.
void drop_unreachable_params(ChunkManager& chunks);
// Removes each of `clients` none of whose tensors is still bound, with its
// chunks (manage.cc).
void remove_clients_without_bindings(ChunkManager& chunks,
                                     const std::unordered_set<std::uint32_t>& clients);

// Gradient binding (grad_binding.cc).
// Makes a chunk-resident gradient for `managed.param` (registered as kind
// grad under `managed.grad_id`) and sets param.grad to it, keeping the values
// of a gradient already there.
void bind_grad(ChunkManager& chunks, ManagedParam& managed);
// Note [Binding right after accumulation]: from now on each backward's fresh
// gradient goes into the grad chunk as soon as autograd has stored it; undone
// by stop_rebinding_after_accumulation (unmanage).
void rebind_after_accumulation(const std::shared_ptr<ManagedParam>& managed);
// Note [set_data on a managed parameter] (param_rebinding.cc): new data of
// the old layout goes into the chunk, and the parameter points there again;
// throws std::runtime_error for another shape or dtype.
void rebind_param_if_replaced(ChunkManager& chunks, ManagedParam& managed);
bool same_layout(const at::TensorBase& a,
                 const at::TensorBase& b);  // sizes, strides, dtype, device
// "managed parameter 'name' (Float 3x3 -> Double 3x3)", for errors.
std::string describe_layout_change(ChunkManager& chunks, const ManagedParam& managed,
                                   const at::TensorBase& new_data);
void stop_rebinding_after_accumulation(ManagedParam& managed);
// If autograd replaced param.grad with a tensor of its own (set-to-none
// zero_grad, then backward), copies it into the grad chunk and binds the
// chunk tensor again. Cheap when nothing changed.
void rebind_grad_if_replaced(ChunkManager& chunks, ManagedParam& managed);
// param.grad is defined and over the bound gradient's storage: the gradient
// in use is the chunk's. Under managed.grad_mutex.
bool grad_is_bound_locked(const ManagedParam& managed);
// Note [A gradient set to none is not fetched] (dead_gradients.cc): the
// gradient's chunk tensor is discarded when param.grad is no longer it and
// nothing but the bridge holds it; true when it was. Under
// managed.grad_mutex.
bool discard_gradient_if_dead_locked(ChunkManager& chunks, ManagedParam& managed);
// Nothing but the bridge holds the bound gradient tensor or its storage (a
// defined bound_grad). Under managed.grad_mutex.
bool only_the_bridge_holds_bound_grad(const ManagedParam& managed);
// The same for every managed parameter, or every one of `client`'s.
void discard_dead_gradients(ChunkManager& chunks, std::optional<ClientId> client = std::nullopt);
// Where in a step discard_dead_gradients_once_per_step looks.
enum class DeadGradientCheck {
  first_param_use,       // the first op of the step that uses one of the model's parameters
  first_fresh_gradient,  // the first gradient of the step's backward
};
// discard_dead_gradients for `client`, at most once at `check` between two
// step boundaries. Cheap when it has looked already.
void discard_dead_gradients_once_per_step(ChunkManager& chunks, ClientId client,
                                          DeadGradientCheck check);
// Note [A parameter unfrozen after manage()] (manage.cc): a parameter frozen
// when managed that requires grad now gets its grad chunk, bound, and the
// hook on its gradient accumulator. Cheap when there is nothing to do.
void give_gradient_if_unfrozen(ChunkManager& chunks, const std::shared_ptr<ManagedParam>& managed);

}  // namespace spillway::torch_bridge
