// manage / unmanage: moving parameters into chunks and back, and the rest of
// the public API (configure, memory_stats_json, step).
//
// Note [Taking a parameter's bytes]
// Manage swaps the storage's own DataPtr out (set_data_ptr returns it), so the
// original bytes stay alive, owned by the bridge, until they are copied into
// the chunk; then they are freed. From then on the storage holds a DataPtr
// without a deleter into chunk memory, updated by the observer
// (binding_table.cc) on every move.
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "allocator/config/format_bytes.h"
#include "hooks/torch/bridge.h"
#include "hooks/torch/client_names.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/op_gpu_timing.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/spillway_torch.h"
#include "hooks/torch/torch_out_of_memory.h"

namespace spillway {

using torch_bridge::Binding;
using torch_bridge::binding_table;
using torch_bridge::ManagedParam;

namespace {

std::string describe_failure(const char* what, const std::string& name) {
  return std::string("spillway: ") + what + " of '" + name +
         "' failed: " + ChunkManager::last_error();
}

TensorId register_storage(ChunkManager& chunks, ClientId client, TensorKind kind,
                          const at::Tensor& tensor, const std::string& name) {
  const c10::StorageImpl& storage = *tensor.storage().unsafeGetStorageImpl();
  TensorSpec spec;
  spec.kind = kind;
  spec.dtype_bytes = tensor.element_size();
  spec.element_count = storage.nbytes() / tensor.element_size();
  spec.name = name;
  TensorId id{};
  if (chunks.register_tensor(client, spec, &id) != Status::ok)
    throw std::runtime_error(describe_failure("registering", name));
  return id;
}

// Note [Taking a parameter's bytes].
void move_into_chunk(ChunkManager& chunks, TensorId id, c10::StorageImpl& storage,
                     c10::Device device, at::DataPtr original, const std::string& name) {
  void* chunk_address = nullptr;
  const Status status =
      chunks.acquire(id, Stream{}, &chunk_address, AccessMode::read_write, WaitMode::host);
  if (status == Status::out_of_memory)
    torch_bridge::throw_chunk_out_of_memory("placing '" + name + "' in its chunk",
                                            ChunkManager::last_error());
  if (status != Status::ok) throw std::runtime_error(describe_failure("placing", name));
  torch_bridge::point_storage_at(storage, chunk_address, device);
  torch_bridge::copy_bytes(chunk_address, original.get(), storage.nbytes());
  chunks.release(id, Stream{});
}

// `kind` names the client ("torch" unless the caller says, as the Python
// package does with a module's class).
void manage_params(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                   const std::string& kind) {
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  torch_bridge::drop_unreachable_params(chunks);  // Note [A parameter only the bridge holds goes]
  torch_bridge::BindingTable& table = binding_table();

  // What is new: tied weights share a storage, and what is managed stays
  // where it is. Nothing new adds no client.
  std::unordered_set<const c10::StorageImpl*> seen;
  std::vector<std::pair<std::string, torch::Tensor>> fresh;
  for (const auto& [name, param] : named) {
    if (!param.defined() || !param.has_storage() || param.storage().nbytes() == 0) continue;
    const c10::StorageImpl* storage = param.storage().unsafeGetStorageImpl();
    if (table.contains(storage) || !seen.insert(storage).second) continue;
    fresh.emplace_back(name, param);
  }
  if (fresh.empty()) return;
  torch_bridge::join_group_from_environment_if_configured();  // dist:env
  const std::string client_name = torch_bridge::unique_client_name(kind);
  const ClientId client = chunks.add_client(client_name);
  torch_bridge::name_client(client, client_name);

  // Note [Register first, then write]
  // A chunk is sealed once accessed, so every tensor is registered before any
  // is written; otherwise each parameter would open a chunk of its own.
  std::vector<std::pair<std::string, std::shared_ptr<ManagedParam>>> placed;
  for (const auto& [name, param] : fresh) {
    auto managed = std::make_shared<ManagedParam>();
    managed->client = client;
    managed->param = param;
    managed->bound_param = param.detach();  // Note [set_data on a managed parameter]
    managed->param_id = register_storage(chunks, client, TensorKind::param, param, name);
    // The gradient has the parameter's layout, hence its storage size. A
    // frozen parameter (requires_grad false) gets none.
    managed->without_gradient = !param.requires_grad();
    if (!managed->without_gradient)
      managed->grad_id = register_storage(chunks, client, TensorKind::grad, param, name + ".grad");
    placed.emplace_back(name, std::move(managed));
  }
  for (auto& [name, managed] : placed) {
    c10::StorageImpl* storage = managed->param.storage().unsafeGetStorageImpl();
    const c10::Device device = storage->data_ptr().device();
    at::DataPtr original = storage->set_data_ptr(at::DataPtr(nullptr, device));
    table.insert(Binding{managed->param_id, TensorKind::param,
                         c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage), device,
                         managed});
    move_into_chunk(chunks, managed->param_id, *storage, device, std::move(original), name);
    if (managed->param.requires_grad()) {
      torch_bridge::bind_grad(chunks, *managed);
      torch_bridge::rebind_after_accumulation(managed);
    }
  }
  torch_bridge::join_data_parallel(chunks, client);  // Note [Data parallel over chunk groups]
}

std::vector<std::pair<std::string, torch::Tensor>> unnamed(std::vector<torch::Tensor> params) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  named.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    named.emplace_back("param" + std::to_string(i), std::move(params[i]));
  return named;
}

// Copies a managed storage's bytes into memory of its own and forgets it.
void unbind_storage(ChunkManager& chunks, c10::StorageImpl* storage) {
  std::optional<Binding> binding = binding_table().find(storage);
  if (!binding) return;
  // Before the acquire: on the sim device this allocation is the device's
  // (Note [torch's CPU allocator on the sim device]), and may spill chunks or
  // throw torch's out-of-memory error, which must not leave the chunk pinned.
  at::DataPtr own = c10::GetAllocator(binding->device.type())->allocate(storage->nbytes());
  void* chunk_address = nullptr;
  const Status status =
      chunks.acquire(binding->tensor, Stream{}, &chunk_address, AccessMode::read, WaitMode::host);
  if (status != Status::ok) {
    const std::optional<TensorInfo> info = chunks.tensor_info(binding->tensor);
    const std::string name =
        info.has_value() ? info->name
                         : "tensor #" + std::to_string(static_cast<std::uint64_t>(binding->tensor));
    // Those unmanaged before it stay so, with their values; it and the rest
    // stay managed, with theirs.
    throw std::runtime_error(describe_failure("unmanaging", name) +
                             ". The parameters unmanaged before it are ordinary tensors now; "
                             "it and those after it are still managed");
  }
  torch_bridge::copy_bytes(own.get(), chunk_address, storage->nbytes());
  binding_table().erase(storage);
  storage->set_data_ptr_noswap(std::move(own));
  chunks.release(binding->tensor, Stream{});
  chunks.discard(binding->tensor);
}

void unmanage_params(const std::vector<torch::Tensor>& params) {
  if (binding_table().empty()) return;
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  torch_bridge::drop_unreachable_params(chunks);  // Note [A parameter only the bridge holds goes]
  // By the parameter (set_data may have given it another storage), or else
  // by its storage (a tensor that shares it, such as param.data).
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<ManagedParam>> by_param;
  for (const auto& managed : binding_table().managed_params())
    by_param.emplace(managed->param.unsafeGetTensorImpl(), managed);
  std::unordered_set<std::uint32_t> touched_clients;
  for (const torch::Tensor& param : params) {
    if (!param.defined()) continue;
    std::shared_ptr<ManagedParam> found;
    if (const auto it = by_param.find(param.unsafeGetTensorImpl()); it != by_param.end()) {
      found = it->second;
    } else if (param.has_storage()) {
      if (std::optional<Binding> binding =
              binding_table().find(param.storage().unsafeGetStorageImpl()))
        found = binding->managed;
    }
    if (found == nullptr) continue;
    ManagedParam& managed = *found;
    // Note [Parameters gathered for their use] (sharded_params.cc): the
    // bytes copied out below must be here; a collective when they are not.
    ManagedParam* const use[] = {&managed};
    torch_bridge::gather_for_op(use);
    torch_bridge::stop_rebinding_after_accumulation(managed);
    torch_bridge::rebind_grad_if_replaced(chunks, managed);
    // Note [set_data on a managed parameter]: data of the old layout goes
    // back into the chunk first, and out with it; data of another layout is
    // the parameter's own already, and the chunk's copy is dropped.
    c10::StorageImpl* storage = managed.bound_param.storage().unsafeGetStorageImpl();
    if (managed.param.storage().unsafeGetStorageImpl() != storage &&
        torch_bridge::same_layout(managed.param, managed.bound_param))
      torch_bridge::rebind_param_if_replaced(chunks, managed);
    unbind_storage(chunks, storage);
    if (managed.bound_grad_storage != nullptr) unbind_storage(chunks, managed.bound_grad_storage);
    touched_clients.insert(static_cast<std::uint32_t>(managed.client));
  }
  torch_bridge::remove_clients_without_bindings(chunks, touched_clients);
}

}  // namespace

namespace torch_bridge {

// Note [A parameter unfrozen after manage()]
// manage() gives a parameter a grad chunk and a hook on its gradient
// accumulator only if it requires grad then. One unfrozen later
// (requires_grad_(True), as fine-tuning schedules do) would otherwise get
// gradients that torch keeps outside any chunk and that no hook sees:
// spillway's optimizers refuse them, and data parallel training would reduce
// nothing, so each rank would step its own gradient, silently (torch's DDP
// has that trap and documents it). So the parameter gets both when spillway
// first sees it requiring grad: at the first op that uses it (op_hooks.cc),
// before the forward records it in autograd's graph, and at every data
// parallel reduction (rank_layouts), which every rank runs, so that a rank
// whose forward did not use it still has a chunk for the owner's mean. A
// gradient autograd already made is copied in (bind_grad).
void give_gradient_if_unfrozen(ChunkManager& chunks, const std::shared_ptr<ManagedParam>& managed) {
  if (!managed->without_gradient.load(std::memory_order_acquire) || !managed->param.requires_grad())
    return;
  static std::mutex giving;
  std::lock_guard lock(giving);
  if (!managed->without_gradient.load(std::memory_order_acquire)) return;  // another thread did
  const std::optional<TensorInfo> info = chunks.tensor_info(managed->param_id);
  const std::string name = info.has_value() ? info->name : std::string("a parameter");
  managed->grad_id =
      register_storage(chunks, managed->client, TensorKind::grad, managed->param, name + ".grad");
  bind_grad(chunks, *managed);
  rebind_after_accumulation(managed);
  managed->without_gradient.store(false, std::memory_order_release);
}

void remove_clients_without_bindings(ChunkManager& chunks,
                                     const std::unordered_set<std::uint32_t>& clients) {
  for (const std::uint32_t client : clients) {
    bool still_bound = false;
    for (const auto& managed : binding_table().managed_params())
      still_bound = still_bound || static_cast<std::uint32_t>(managed->client) == client;
    if (!still_bound) chunks.remove_client(static_cast<ClientId>(client));
  }
}

}  // namespace torch_bridge

void configure(const std::string& conf) {
  std::string error;
  if (!Runtime::process().configure(conf, &error)) throw std::invalid_argument(error);
}

void activate() { torch_bridge::active_chunk_manager(); }

// Buffers (batch norm's running statistics) go into chunks like frozen
// parameters: no gradient, and the ops that update them in place acquire them
// for writing (Note [Which inputs an op writes] in op_hooks.cc).
void manage(torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    named.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    named.emplace_back(item.key(), item.value());
  manage_params(named, "torch");
}

void manage(std::vector<torch::Tensor> params) {
  manage_params(unnamed(std::move(params)), "torch");
}

void manage(std::vector<std::pair<std::string, torch::Tensor>> named_params,
            const std::string& client_name) {
  manage_params(named_params, client_name);
}

void unmanage(torch::nn::Module& module) {
  std::vector<torch::Tensor> tensors = module.parameters(/*recurse=*/true);
  for (const torch::Tensor& buffer : module.buffers(/*recurse=*/true)) tensors.push_back(buffer);
  unmanage_params(tensors);
}

void unmanage(std::vector<torch::Tensor> params) { unmanage_params(params); }

bool is_managed(const torch::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage() || binding_table().empty()) return false;
  return binding_table().find(tensor.storage().unsafeGetStorageImpl()).has_value();
}

std::string memory_stats_json() {
  Runtime& runtime = Runtime::process();
  if (runtime.active_allocator() == nullptr) return "{}";
  // Note [A parameter only the bridge holds goes]: the figures without them.
  if (!binding_table().empty())
    torch_bridge::drop_unreachable_params(torch_bridge::active_chunk_manager());
  nlohmann::ordered_json json = nlohmann::ordered_json::parse(
      torch_bridge::add_client_stats(runtime.stats().to_json(), runtime.chunk_manager()));
  json["op_timing"] = torch_bridge::OpGpuTiming::process().stats();
  return json.dump();
}

void step() {
  // Not an activation: a program that never managed anything stays as it is.
  Runtime& runtime = Runtime::process();
  if (runtime.active_allocator() == nullptr) return;
  // Before the step ends: the rebinding's accesses belong to the step whose
  // set_data or zero_grad made them, not to the next one's trace. A
  // rebinding that fails still lets the step end, then reaches the caller.
  std::exception_ptr rebinding_failed;
  if (!binding_table().empty()) {
    ChunkManager& chunks = torch_bridge::active_chunk_manager();
    torch_bridge::drop_unreachable_params(chunks);  // Note [A parameter only the bridge holds goes]
    for (const auto& managed : binding_table().managed_params()) {
      try {
        torch_bridge::rebind_param_if_replaced(chunks, *managed);
      } catch (const std::runtime_error&) {
        if (!rebinding_failed) rebinding_failed = std::current_exception();
      }
      torch_bridge::rebind_grad_if_replaced(chunks, *managed);
    }
    // Note [A gradient set to none is not fetched]: a loop that zeroed them
    // after its optimizer step.
    torch_bridge::discard_dead_gradients(chunks);
  }
  // Note [Data parallel over chunk groups]: after the owners' optimizer step.
  if (!binding_table().empty())
    torch_bridge::gather_owned_parameters(torch_bridge::active_chunk_manager());
  runtime.chunk_manager().end_step();
  torch_bridge::OpGpuTiming::process().on_step_end();
  if (rebinding_failed) std::rethrow_exception(rebinding_failed);
  check_budget_fits_ops();
}

// Note [A budget below the smallest]
// An op whose chunks do not fit ran past the budget (the hook cannot fail
// it), so the error comes here, at the first step boundary after it, where an
// exception reaches the caller: spillway::step(), which Python's optimizers
// call from a global step hook (Note [Python optimizers mark the step] in
// python/spillway/__init__.py). It is raised once per new largest need, so a caller
// that catches it and goes on (overrunning) is not stopped every step.
void check_budget_fits_ops() {
  Runtime& runtime = Runtime::process();
  if (runtime.active_allocator() == nullptr) return;
  ChunkManager& chunks = runtime.chunk_manager();
  const std::size_t needed = chunks.min_budget_bytes();
  const std::size_t budget = chunks.effective_budget_bytes();
  static std::mutex mutex;
  static std::size_t reported = 0;
  {
    std::lock_guard lock(mutex);
    if (needed <= budget || needed <= reported) return;
    reported = needed;
  }
  throw std::runtime_error(fmt::format(
      "spillway: op {} needs {} of chunks on the device at once, more than the device budget "
      "for chunks, {}; it ran past the budget (num_budget_overruns). Set device_budget to at "
      "least {} (min_budget_bytes), or a smaller chunk_size so that its chunks hold less "
      "besides its own tensors",
      chunks.min_budget_user(), format_bytes(needed), format_bytes(budget), format_bytes(needed)));
}

}  // namespace spillway
