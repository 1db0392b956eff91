// ChunkedOptimizer: the machinery Adam, AdamW and SGD share (optim.h):
// placing each parameter's state and fp32 master copy in the optimizer's own
// chunks, running each update where the parameter's chunk is, the gradient
// summary, and save / load.
//
// Note [Register a parameter's state before writing any]
// A chunk is sealed once accessed (Note [Register first, then write] in
// manage.cc), so place_all registers every new tensor first and only then
// initialises the master copies; otherwise each master copy would open a chunk
// of its own.
//
// Note [Where an update runs]
// The parameter's chunk decides. On the device the update needs the param,
// grad, master and state chunks there at once; when their capacities exceed
// the chunk budget, or an acquire fails for want of room (chunks in use
// elsewhere), it runs on the host instead, which moves the param and grad
// chunks back rather than failing the step. On the sim device "device memory"
// is host memory, so the CPU kernel runs on it directly (WaitMode::host); on a
// GPU a CUDA kernel is queued on the stream the chunks are acquired and
// released on (WaitMode::stream).
//
// Note [Gradients outside their chunks]
// After a set-to-none zero_grad autograd's fresh gradient is copied into the
// grad chunk first (rebind_grad_if_replaced). A gradient the chunk cannot hold
// (another dtype or shape, sparse) is an error: the kernels read only chunk
// memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "hooks/torch/bridge.h"
#include "hooks/torch/client_names.h"
#include "hooks/torch/optim.h"
#include "hooks/torch/spillway_torch.h"
#include "hooks/torch/torch_parallel_for.h"

namespace spillway::optim {

namespace {

using torch_bridge::ManagedParam;

std::runtime_error chunk_failure(const std::string& what) {
  return std::runtime_error("spillway optim: " + what + " failed: " + ChunkManager::last_error());
}

// Element type of a parameter or gradient as the kernels name it; f32 means
// "no master copy needed".
cpu::DType kernel_dtype(at::ScalarType type, const char* what) {
  switch (type) {
    case at::kFloat:
      return cpu::DType::f32;
    case at::kBFloat16:
      return cpu::DType::bf16;
    case at::kHalf:
      return cpu::DType::f16;
    default:
      throw std::invalid_argument(std::string("spillway optim: ") + what + " of dtype " +
                                  std::string(c10::toString(type)) +
                                  " is not supported (float, bfloat16 or half)");
  }
}

std::string client_name_for(const std::string& kind) {
  static std::mutex mutex;
  static std::map<std::string, int> next;
  std::lock_guard lock(mutex);
  return kind + "#" + std::to_string(next[kind]++);
}

// One parameter's chunk-resident tensors and its progress.
struct ParamRecord {
  at::Tensor param;
  std::shared_ptr<ManagedParam> managed;
  std::size_t count = 0;  // elements of the parameter's whole storage
  cpu::DType dtype = cpu::DType::f32;
  TensorId master{};  // for bf16/fp16 parameters
  bool master_ready = false;
  std::vector<TensorId> state;
  std::int64_t step = 0;
  bool state_started = false;
  std::string label;  // "adam#0.p3", for messages and tensor names
  bool low_precision() const { return dtype != cpu::DType::f32; }
};

// Acquisitions of one update, released however the update ends.
class Acquisitions {
 public:
  Acquisitions(ChunkManager& chunks, bool on_host, Stream stream)
      : chunks_(chunks), on_host_(on_host), stream_(stream) {}
  ~Acquisitions() { release_all(); }
  Acquisitions(const Acquisitions&) = delete;
  Acquisitions& operator=(const Acquisitions&) = delete;

  // The tensor's address, or null when the chunk manager refused.
  void* acquire(TensorId tensor, AccessMode access, WaitMode wait) {
    void* address = nullptr;
    const Status status = on_host_ ? chunks_.acquire_host(tensor, &address, access)
                                   : chunks_.acquire(tensor, stream_, &address, access, wait);
    if (status != Status::ok) return nullptr;
    acquired_.push_back(tensor);
    return address;
  }
  void release_all() {
    for (const TensorId tensor : acquired_) {
      if (on_host_) {
        chunks_.release_host(tensor);
      } else {
        chunks_.release(tensor, stream_);
      }
    }
    acquired_.clear();
  }

 private:
  ChunkManager& chunks_;
  bool on_host_;
  Stream stream_;
  std::vector<TensorId> acquired_;
};

// Copies a chunk tensor's bytes out (save) or in (load), on the host.
void read_chunk_tensor(ChunkManager& chunks, TensorId id, void* destination, std::size_t bytes) {
  Acquisitions host(chunks, /*on_host=*/true, Stream{});
  const void* source = host.acquire(id, AccessMode::read, WaitMode::host);
  if (source == nullptr) throw chunk_failure("reading optimizer state");
  std::memcpy(destination, source, bytes);
}

void write_chunk_tensor(ChunkManager& chunks, TensorId id, const void* source, std::size_t bytes) {
  Acquisitions host(chunks, /*on_host=*/true, Stream{});
  void* destination = host.acquire(id, AccessMode::read_write, WaitMode::host);
  if (destination == nullptr) throw chunk_failure("writing optimizer state");
  std::memcpy(destination, source, bytes);
}

const c10::StorageImpl* storage_of(const at::Tensor& tensor) {
  return tensor.storage().unsafeGetStorageImpl();
}

// The record's chunk tensors are the bridge's; after an unmanage they are gone.
void check_still_managed(const ParamRecord& record) {
  const std::optional<torch_bridge::Binding> binding =
      torch_bridge::binding_table().find(storage_of(record.param));
  if (!binding || binding->managed != record.managed)
    throw std::runtime_error("spillway optim: " + record.label +
                             " was unmanaged while the optimizer holds its state");
}

}  // namespace

struct ChunkedOptimizer::Impl {
  std::string name;
  ClientId client{};
  bool has_client = false;
  // Keyed by storage: tied parameters share one record and are updated once.
  std::unordered_map<const c10::StorageImpl*, std::unique_ptr<ParamRecord>> records;
  UpdatePlacement placement;

  ParamRecord* find(const at::Tensor& param) const {
    if (!param.defined() || !param.has_storage()) return nullptr;
    const auto found = records.find(storage_of(param));
    return found == records.end() ? nullptr : found->second.get();
  }
};

ChunkedOptimizer::ChunkedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                   std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                                   std::string kind)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)),
      impl_(std::make_unique<Impl>()) {
  impl_->name = client_name_for(kind);
}

ChunkedOptimizer::~ChunkedOptimizer() {
  // The process runtime outlives every optimizer (Note [The process runtime
  // lives forever]); the state chunks go with the optimizer.
  if (impl_ && impl_->has_client) Runtime::process().chunk_manager().remove_client(impl_->client);
}

const std::string& ChunkedOptimizer::client_name() const { return impl_->name; }

UpdatePlacement ChunkedOptimizer::placement() const { return impl_->placement; }

void ChunkedOptimizer::place_all() {
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  torch_bridge::BindingTable& table = torch_bridge::binding_table();

  std::vector<torch::Tensor> unmanaged;
  std::unordered_set<const c10::StorageImpl*> seen;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) {
      if (!param.defined() || !param.has_storage() || impl_->find(param) != nullptr) continue;
      kernel_dtype(param.scalar_type(), "a parameter");
      if (!table.contains(storage_of(param)) && seen.insert(storage_of(param)).second)
        unmanaged.push_back(param);
    }
  }
  if (!unmanaged.empty()) spillway::manage(unmanaged);

  if (!impl_->has_client) {
    impl_->client = chunks.add_client(impl_->name);
    torch_bridge::name_client(impl_->client, impl_->name);
    impl_->has_client = true;
  }

  // Note [Register a parameter's state before writing any].
  auto register_tensor = [&](TensorKind kind, std::uint32_t slot, std::size_t count,
                             const std::string& name) {
    TensorSpec spec;
    spec.kind = kind;
    spec.slot = slot;
    spec.dtype_bytes = sizeof(float);
    spec.element_count = count;
    spec.name = name;
    TensorId id{};
    if (chunks.register_tensor(impl_->client, spec, &id) != Status::ok)
      throw chunk_failure("registering " + name);
    return id;
  };
  std::vector<ParamRecord*> masters_to_fill;
  for (const auto& group : param_groups_) {
    const int slots = state_slots(group.options());
    for (const torch::Tensor& param : group.params()) {
      // A frozen parameter gets no state until it requires grad again.
      if (!param.defined() || !param.has_storage() || !param.requires_grad()) continue;
      ParamRecord* record = impl_->find(param);
      if (record == nullptr) {
        const std::optional<torch_bridge::Binding> binding = table.find(storage_of(param));
        if (!binding || binding->managed == nullptr)
          throw std::runtime_error(
              "spillway optim: a parameter's storage is managed, but not as a parameter");
        auto created = std::make_unique<ParamRecord>();
        created->param = param;
        created->managed = binding->managed;
        created->count = param.storage().nbytes() / param.element_size();
        created->dtype = kernel_dtype(param.scalar_type(), "a parameter");
        created->label = impl_->name + ".p" + std::to_string(impl_->records.size());
        if (created->low_precision()) {
          created->master =
              register_tensor(TensorKind::master, 0, created->count, created->label + ".master");
          masters_to_fill.push_back(created.get());
        }
        record = created.get();
        impl_->records.emplace(storage_of(param), std::move(created));
      }
      while (static_cast<int>(record->state.size()) < slots) {
        const auto slot = static_cast<std::uint32_t>(record->state.size());
        record->state.push_back(register_tensor(TensorKind::optimizer_state, slot, record->count,
                                                record->label + ".state" + std::to_string(slot)));
      }
    }
  }

  // The master copy starts as the parameter's value, widened.
  for (ParamRecord* record : masters_to_fill) {
    Acquisitions host(chunks, /*on_host=*/true, Stream{});
    const void* param = host.acquire(record->managed->param_id, AccessMode::read, WaitMode::host);
    auto* master =
        static_cast<float*>(host.acquire(record->master, AccessMode::read_write, WaitMode::host));
    if (param == nullptr || master == nullptr)
      throw chunk_failure("initialising the master copy of " + record->label);
    cpu::convert_to_float(param, record->dtype, master, record->count, torch_exec_config());
    record->master_ready = true;
  }
}

torch::Tensor ChunkedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_scaled(1.0);
  return loss;
}

void ChunkedOptimizer::step_scaled(double grad_scale) {
  at::NoGradGuard no_grad;
  place_all();  // parameters of groups added since
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  Runtime& runtime = Runtime::process();
  const bool on_cuda = runtime.device().kind() == DeviceKind::cuda;
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  const std::size_t budget =
      std::min(chunks.device_budget_bytes(), allocator != nullptr ? allocator->budget_bytes() : 0);
  std::unordered_set<const ParamRecord*> stepped;  // tied parameters: once

  for (const auto& group : param_groups_) {
    const torch::optim::OptimizerOptions& options = group.options();
    const int slots = state_slots(options);
    for (const torch::Tensor& param : group.params()) {
      ParamRecord* record = impl_->find(param);
      if (record == nullptr || !stepped.insert(record).second) continue;
      check_still_managed(*record);
      // Note [Gradients outside their chunks].
      torch_bridge::rebind_grad_if_replaced(chunks, *record->managed);
      const torch::Tensor grad = param.grad();
      if (!grad.defined()) continue;  // as torch: no gradient, no step
      if (grad.is_sparse() || !grad.has_storage() ||
          storage_of(grad) != record->managed->bound_grad_storage)
        throw std::runtime_error("spillway optim: the gradient of " + record->label +
                                 " is not in its grad chunk (sparse, or another dtype or shape "
                                 "than the parameter)");

      Update update;
      update.count = record->count;
      update.grad_dtype = kernel_dtype(grad.scalar_type(), "a gradient");
      update.params_low_dtype = record->dtype;
      update.grad_scale = static_cast<float>(grad_scale);
      update.step = record->step + 1;
      update.state_fresh = !record->state_started;

      // The tensors of this update, in acquire order, and their access.
      struct Part {
        TensorId id;
        AccessMode access;
      };
      std::vector<Part> parts{{record->managed->param_id, AccessMode::read_write},
                              {record->managed->grad_id, AccessMode::read}};
      if (record->low_precision()) parts.push_back({record->master, AccessMode::read_write});
      for (int slot = 0; slot < slots; ++slot)
        parts.push_back({record->state[slot], AccessMode::read_write});
      auto fill = [&](const std::vector<void*>& addresses) {
        update.params = static_cast<float*>(addresses[0]);
        update.grads = addresses[1];
        std::size_t next = 2;
        if (record->low_precision()) {
          update.params_low = addresses[0];
          update.params = static_cast<float*>(addresses[next++]);
        }
        for (int slot = 0; slot < slots; ++slot)
          update.state[slot] = static_cast<float*>(addresses[next++]);
      };

      // Note [Where an update runs].
      bool done = false;
      const std::optional<TensorInfo> where = chunks.tensor_info(record->managed->param_id);
      if (where && where->location == Location::device) {
        std::unordered_set<std::uint32_t> distinct;
        std::size_t capacity = 0;
        for (const Part& part : parts) {
          const std::optional<TensorInfo> info = chunks.tensor_info(part.id);
          if (!info || !distinct.insert(static_cast<std::uint32_t>(info->chunk)).second) continue;
          if (const std::optional<ChunkInfo> chunk = chunks.chunk_info(info->chunk))
            capacity += chunk->capacity_bytes;
        }
        if (capacity <= budget) {
          const Stream stream{};
          Acquisitions device(chunks, /*on_host=*/false, stream);
          std::vector<void*> addresses;
          for (const Part& part : parts) {
            void* address =
                device.acquire(part.id, part.access, on_cuda ? WaitMode::stream : WaitMode::host);
            if (address == nullptr) break;
            addresses.push_back(address);
          }
          if (addresses.size() == parts.size()) {
            fill(addresses);
            run_update(options, update, on_cuda ? Target::cuda : Target::cpu, stream.handle);
            ++impl_->placement.device;
            done = true;
          }
        }
      }
      if (!done) {
        Acquisitions host(chunks, /*on_host=*/true, Stream{});
        std::vector<void*> addresses;
        for (const Part& part : parts) {
          void* address = host.acquire(part.id, part.access, WaitMode::host);
          if (address == nullptr) throw chunk_failure("acquiring the tensors of " + record->label);
          addresses.push_back(address);
        }
        fill(addresses);
        run_update(options, update, Target::cpu, nullptr);
        ++impl_->placement.host;
      }
      record->step = update.step;
      if (slots > 0) record->state_started = true;
    }
  }
}

GradientSummary ChunkedOptimizer::gradient_summary(double grad_scale) {
  at::NoGradGuard no_grad;
  place_all();
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  const bool sim = Runtime::process().device().kind() == DeviceKind::sim;
  double sum_squares = 0.0;
  bool found_inf = false;
  std::unordered_set<const ParamRecord*> seen;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) {
      ParamRecord* record = impl_->find(param);
      if (record == nullptr || !seen.insert(record).second) continue;
      check_still_managed(*record);
      torch_bridge::rebind_grad_if_replaced(chunks, *record->managed);
      const torch::Tensor grad = param.grad();
      if (!grad.defined()) continue;
      if (!grad.has_storage() || storage_of(grad) != record->managed->bound_grad_storage)
        throw std::runtime_error("spillway optim: the gradient of " + record->label +
                                 " is not in its grad chunk");
      const TensorId id = record->managed->grad_id;
      const std::optional<TensorInfo> info = chunks.tensor_info(id);
      // On the sim device a resident gradient is read where it is; on a GPU
      // it is read on the host (a copy back; no reduction kernel yet).
      const bool in_place = sim && info && info->location == Location::device;
      Acquisitions access(chunks, /*on_host=*/!in_place, Stream{});
      const void* data = access.acquire(id, AccessMode::read, WaitMode::host);
      if (data == nullptr) throw chunk_failure("reading the gradient of " + record->label);
      const cpu::GradStats stats = cpu::grad_stats(
          data, kernel_dtype(grad.scalar_type(), "a gradient"), record->count, torch_exec_config());
      sum_squares += stats.sum_squares;
      found_inf = found_inf || stats.found_inf;
    }
  }
  return {std::sqrt(sum_squares) * std::fabs(grad_scale), found_inf};
}

std::optional<ChunkedOptimizer::ParamState> ChunkedOptimizer::param_state(
    const torch::Tensor& param) const {
  const ParamRecord* record = impl_->find(param);
  if (record == nullptr) return std::nullopt;
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  const auto count = static_cast<std::int64_t>(record->count);
  ParamState state;
  state.step = record->step;
  state.started = record->state_started;
  for (const TensorId slot : record->state) {
    torch::Tensor values = torch::empty({count}, torch::kFloat);
    read_chunk_tensor(chunks, slot, values.data_ptr(), record->count * sizeof(float));
    state.slots.push_back(std::move(values));
  }
  if (record->low_precision()) {
    state.master = torch::empty({count}, torch::kFloat);
    read_chunk_tensor(chunks, record->master, state.master.data_ptr(),
                      record->count * sizeof(float));
  }
  return state;
}

void ChunkedOptimizer::set_param_state(const torch::Tensor& param, const ParamState& state) {
  at::NoGradGuard no_grad;
  ParamRecord* record = impl_->find(param);
  // Placed afresh only when this state does not fit the placement: a
  // parameter added since, or options that now need more slots (a loaded
  // momentum, say). load() and a state dict's loop then place once, not per
  // parameter.
  if (record == nullptr || state.slots.size() > record->state.size()) {
    place_all();
    record = impl_->find(param);
  }
  if (record == nullptr)
    throw std::invalid_argument("spillway optim: " + impl_->name +
                                " holds no state for this parameter");
  if (state.slots.size() > record->state.size())
    throw std::invalid_argument("spillway optim: " + std::to_string(state.slots.size()) +
                                " state arrays for " + record->label + ", whose options need " +
                                std::to_string(record->state.size()));
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  const std::size_t bytes = record->count * sizeof(float);
  auto checked = [&](const torch::Tensor& values, const std::string& what) {
    if (static_cast<std::size_t>(values.numel()) != record->count)
      throw std::invalid_argument("spillway optim: " + what + " of " + record->label + " holds " +
                                  std::to_string(values.numel()) +
                                  " values where the parameter has " +
                                  std::to_string(record->count));
    return values.to(torch::kFloat).contiguous();
  };
  for (std::size_t slot = 0; slot < state.slots.size(); ++slot) {
    const torch::Tensor values = checked(state.slots[slot], "state " + std::to_string(slot));
    write_chunk_tensor(chunks, record->state[slot], values.data_ptr(), bytes);
  }
  if (record->low_precision() && state.master.defined()) {
    const torch::Tensor master = checked(state.master, "the master copy");
    write_chunk_tensor(chunks, record->master, master.data_ptr(), bytes);
    // The parameter is the master copy rounded; keep them consistent even
    // when the model's own weights were not loaded.
    Acquisitions host(chunks, /*on_host=*/true, Stream{});
    void* low = host.acquire(record->managed->param_id, AccessMode::read_write, WaitMode::host);
    if (low == nullptr) throw chunk_failure("writing " + record->label);
    cpu::convert_from_float(master.data_ptr<float>(), low, record->dtype, record->count,
                            torch_exec_config());
  }
  record->step = state.step;
  record->state_started = state.started;
}

// Archive layout: "spillway/groups/<g>/options" (the options' own
// serialisation) and, for the n-th parameter over all groups in order,
// "spillway/params/<n>/" + step, state_started, slots, state<i>, master.
void ChunkedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::OutputArchive options;
    param_groups_[g].options().serialize(options);
    archive.write("spillway/groups/" + std::to_string(g) + "/options", options);
  }
  std::int64_t n = 0;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) {
      const std::string prefix = "spillway/params/" + std::to_string(n++) + "/";
      const std::optional<ParamState> state = param_state(param);
      if (!state) continue;
      archive.write(prefix + "step", c10::IValue(state->step));
      archive.write(prefix + "state_started", c10::IValue(state->started));
      archive.write(prefix + "slots", c10::IValue(static_cast<std::int64_t>(state->slots.size())));
      for (std::size_t slot = 0; slot < state->slots.size(); ++slot)
        archive.write(prefix + "state" + std::to_string(slot), state->slots[slot]);
      if (state->master.defined()) archive.write(prefix + "master", state->master);
    }
  }
}

void ChunkedOptimizer::load(torch::serialize::InputArchive& archive) {
  at::NoGradGuard no_grad;
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::InputArchive options;
    if (archive.try_read("spillway/groups/" + std::to_string(g) + "/options", options))
      param_groups_[g].options().serialize(options);
  }
  place_all();  // with the loaded options' state slots
  std::int64_t n = 0;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) {
      const std::string prefix = "spillway/params/" + std::to_string(n++) + "/";
      c10::IValue step;
      if (impl_->find(param) == nullptr || !archive.try_read(prefix + "step", step)) continue;
      ParamState state;
      state.step = step.toInt();
      c10::IValue started;
      c10::IValue slots;
      archive.read(prefix + "state_started", started);
      archive.read(prefix + "slots", slots);
      state.started = started.toBool();
      for (std::int64_t slot = 0; slot < slots.toInt(); ++slot) {
        torch::Tensor values;
        archive.read(prefix + "state" + std::to_string(slot), values);
        state.slots.push_back(std::move(values));
      }
      torch::Tensor master;
      if (archive.try_read(prefix + "master", master)) state.master = std::move(master);
      set_param_state(param, state);
    }
  }
}

}  // namespace spillway::optim
