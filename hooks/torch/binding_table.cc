// The binding table: which storages the bridge manages, and the observer
// that rebinds them when their chunks move. See Note [Bindings are keyed by
// StorageImpl] and Note [Lock order] in bridge.h.
#include <mutex>
#include <stdexcept>
#include <string>

#include "hooks/torch/bridge.h"
#include "hooks/torch/op_gpu_timing.h"
#include "hooks/torch/sim_torch_allocator.h"

namespace spillway::torch_bridge {

std::optional<Binding> BindingTable::find(const c10::StorageImpl* storage) const {
  std::shared_lock lock(mutex_);
  const auto found = by_storage_.find(storage);
  if (found == by_storage_.end()) return std::nullopt;
  return found->second;
}

void BindingTable::insert(Binding binding) {
  std::unique_lock lock(mutex_);
  c10::StorageImpl* storage = binding.storage.get();
  by_tensor_[binding.tensor] = storage;
  by_storage_[storage] = std::move(binding);
  size_.store(by_storage_.size(), std::memory_order_release);
}

std::optional<Binding> BindingTable::erase(const c10::StorageImpl* storage) {
  std::unique_lock lock(mutex_);
  const auto found = by_storage_.find(storage);
  if (found == by_storage_.end()) return std::nullopt;
  Binding binding = std::move(found->second);
  by_storage_.erase(found);
  by_tensor_.erase(binding.tensor);
  size_.store(by_storage_.size(), std::memory_order_release);
  return binding;
}

std::vector<std::shared_ptr<ManagedParam>> BindingTable::managed_params() const {
  std::shared_lock lock(mutex_);
  std::vector<std::shared_ptr<ManagedParam>> params;
  for (const auto& [storage, binding] : by_storage_)
    if (binding.managed != nullptr && binding.kind == TensorKind::param)
      params.push_back(binding.managed);
  return params;
}

void BindingTable::on_tensors_moved(std::span<const TensorAddress> tensors) {
  // Called with the chunk manager's lock held: only pointer updates here.
  std::shared_lock lock(mutex_);
  for (const TensorAddress& moved : tensors) {
    const auto storage = by_tensor_.find(moved.tensor);
    if (storage == by_tensor_.end()) continue;  // not bound yet, or unmanaged
    const Binding& binding = by_storage_.at(storage->second);
    point_storage_at(*storage->second, moved.address, binding.device);
  }
}

void point_storage_at(c10::StorageImpl& storage, void* address, c10::Device device) {
  // A DataPtr without a deleter: the chunk manager owns the memory.
  storage.set_data_ptr_noswap(at::DataPtr(address, device));
}

BindingTable& binding_table() {
  static BindingTable* const table = new BindingTable();  // never destroyed
  return *table;
}

std::shared_ptr<ManagedParam> managed_param_bound_to(const at::TensorBase& tensor) {
  if (binding_table().empty() || !tensor.defined() || !tensor.has_storage()) return nullptr;
  std::optional<Binding> binding = binding_table().find(tensor.storage().unsafeGetStorageImpl());
  if (!binding || binding->kind != TensorKind::param || binding->managed == nullptr) return nullptr;
  if (binding->managed->param.unsafeGetTensorImpl() != tensor.unsafeGetTensorImpl()) return nullptr;
  return binding->managed;
}

ChunkManager& active_chunk_manager() {
  Runtime& runtime = Runtime::process();
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  if (allocator == nullptr) throw std::runtime_error("spillway: " + error);
  static std::once_flag installed;
  std::call_once(installed, [&runtime, allocator] {
    // Note [torch's CPU allocator on the sim device].
    if (runtime.device().kind() == DeviceKind::sim) install_sim_torch_allocator(*allocator);
    OpGpuTiming::process().start(runtime);  // before the hooks that push ops to it
    runtime.chunk_manager().add_observer(&binding_table());
    install_op_hooks();
    install_set_data_hook();
  });
  return runtime.chunk_manager();
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  Device& device = Runtime::process().device();
  Status status = device.copy_async(dst, src, bytes, Stream{});
  if (status == Status::ok) status = device.synchronize_stream(Stream{});
  if (status != Status::ok)
    throw std::runtime_error("spillway: copying " + std::to_string(bytes) +
                             " bytes of a managed tensor failed: " +
                             std::string(to_string(status)) + " " + device.last_error());
}

}  // namespace spillway::torch_bridge
