// Note [A gradient set to none is not fetched]
// After a set-to-none zero_grad (torch 2's default) a grad chunk still holds
// the last step's gradients, and nothing can read them: param.grad is
// undefined until a backward gives it a fresh tensor, which the bridge then
// copies into the chunk (Note [Binding right after accumulation] in
// grad_binding.cc). Kept, those bytes would be written back when evicted
// and fetched in the next backward only to be overwritten. So the bridge
// discards a gradient once param.grad is no longer its bound tensor and
// nothing outside the bridge holds that tensor or its storage (held_only_by).
// A chunk whose tensors are all discarded has bytes nowhere: nothing is
// written back, and its next fetch zeroes it on the device (Note [A chunk
// without bytes is zeroed on the device] in chunk_manager.cc). A gradient
// someone kept (`g = p.grad` before zero_grad) keeps its bytes.
//
// One gradient discarded frees its chunk only with the others in it, so the
// bridge discards every such gradient at once: at spillway::step() (a loop
// that zeroes after the optimizer step); at the first op of a step that uses
// one of a model's parameters, that model's (a loop that zeroes before its
// forward: the forward's activations get the room at once, and the planned
// policy has the whole forward to zero the chunks on the device ahead of the
// backward; found there only at the backward, each grad chunk was dropped and
// zeroed on use, while the host waited); and at the first fresh gradient of
// a step (a loop that zeroes between its forward and backward), that
// gradient's model's, before it is copied in. Later gradients of that
// backward find theirs discarded already; a loop that never calls step()
// discards each as its fresh one arrives.
//
// Each of the last two looks once per step and model, and the op hook asks at
// every op with a parameter, so the question that it has looked already is
// answered from a per-thread memo of the last (model, step), without the
// bridge's lock, for the ops of one model in a row. Reading the step count
// takes the chunk manager's lock once per parameter of the op, as each of
// their acquires does anyway.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "hooks/torch/bridge.h"
#include "hooks/torch/held_only_by.h"

namespace spillway::torch_bridge {

bool only_the_bridge_holds_bound_grad(const ManagedParam& managed) {
  // bound_grad alone holds its TensorImpl; the Binding and bound_grad hold
  // the storage.
  return managed.bound_grad_storage != nullptr &&
         held_only_by(managed.bound_grad.unsafeGetTensorImpl(), 1) &&
         held_only_by(managed.bound_grad_storage, 2);
}

bool discard_gradient_if_dead_locked(ChunkManager& chunks, ManagedParam& managed) {
  if (!managed.bound_grad.defined() || grad_is_bound_locked(managed)) return false;
  if (!only_the_bridge_holds_bound_grad(managed)) return false;
  // Fails only while the tensor is acquired, which a holder would show.
  return chunks.discard(managed.grad_id) == Status::ok;
}

void discard_dead_gradients(ChunkManager& chunks, std::optional<ClientId> client) {
  for (const std::shared_ptr<ManagedParam>& managed : binding_table().managed_params()) {
    if (client && managed->client != *client) continue;
    std::lock_guard lock(managed->grad_mutex);
    discard_gradient_if_dead_locked(chunks, *managed);
  }
}

// Per client: a backward reads the gradients of its own model only, which no
// other thread's backward writes (models may train side by side on threads).
void discard_dead_gradients_once_per_step(ChunkManager& chunks, ClientId client,
                                          DeadGradientCheck check) {
  // The manager too: a process may configure spillway again (tests do).
  using Where = std::tuple<const ChunkManager*, ClientId, DeadGradientCheck>;
  struct Looked {
    Where where;
    std::uint64_t step;
  };
  thread_local std::optional<Looked> t_looked_at[2];  // one per check: a backward asks both
  static std::mutex mutex;
  static std::map<Where, std::uint64_t>* const looked_in_step =
      new std::map<Where, std::uint64_t>();  // never destroyed
  const Where where{&chunks, client, check};
  const std::uint64_t step = chunks.steps_ended();
  std::optional<Looked>& t_looked = t_looked_at[static_cast<std::size_t>(check)];
  if (t_looked && t_looked->where == where && t_looked->step == step) return;
  t_looked = Looked{where, step};
  {
    std::lock_guard lock(mutex);
    const auto [it, inserted] = looked_in_step->try_emplace(where, step);
    if (!inserted && it->second == step) return;
    it->second = step;
  }
  discard_dead_gradients(chunks, client);
}

}  // namespace spillway::torch_bridge
