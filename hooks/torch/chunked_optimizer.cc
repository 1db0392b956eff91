// ChunkedOptimizer: the machinery Adam, AdamW and SGD share (optim.h):
// placing each parameter's state and fp32 master copy in the optimizer's own
// chunks, running each update where the parameter's chunk is, the gradient
// summary, and save / load.
//
// Note [Register a parameter's state before writing any]
// A chunk is sealed once accessed (Note [Register first, then write] in
// manage.cc), so place_all registers every new tensor first; the master
// copies are written later, at their first step (Note [A master copy starts
// at the first step]); otherwise each master copy would open a chunk of its
// own.
//
// Note [Optimizer state packed by owner]
// Under data parallel training each parameter's state lives on its owner
// (Note [Data parallel over chunk groups] in data_parallel.cc), and a state
// chunk takes memory on a rank only once something in it is written. State
// tensors pack in parameter order, and a bf16 parameter's 12 bytes of state
// and master do not pack like its 2 bytes, so one state chunk would hold
// the end of one owner's parameters and the start of the next owner's, and
// both ranks would hold it. So with a group set, each owner's state and
// masters pack in chunks of their own (TensorSpec::pack_group: the owner
// plus one): no state chunk holds two owners' state.
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
// Note [Host work is not device memory]
// On the sim device spillway is torch's CPU allocator (Note [torch's CPU
// allocator on the sim device] in sim_torch_allocator.cc). What a GPU run does
// in host memory (an update on host-resident chunks, the host tensors that
// param_state returns and set_param_state and load read) runs in a
// HostWorkScope, so any torch tensor it makes is host memory, outside the
// device budget, there too.
//
// Note [Gradients outside their chunks]
// After a set-to-none zero_grad autograd's fresh gradient is copied into the
// grad chunk first (rebind_grad_if_replaced). A gradient the chunk cannot hold
// (another dtype or shape, sparse) is an error: the kernels read only chunk
// memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "hooks/torch/bridge.h"
#include "hooks/torch/client_names.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/optim.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/sim_torch_allocator.h"
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

std::size_t bytes_per_element(cpu::DType type) { return type == cpu::DType::f32 ? 4 : 2; }

// One array of an update (param, grad, master or a state slot) and where it
// lies, for Note [One kernel call per run].
struct Part {
  TensorId id{};
  AccessMode access = AccessMode::read;
  std::size_t bytes = 0;
  bool placed = false;  // chunk and offset known
  ChunkId chunk{};
  std::size_t offset = 0;
};

// A parameter that steps now: its record and its arrays in acquire order.
struct Due {
  ParamRecord* record = nullptr;
  cpu::DType grad_dtype = cpu::DType::f32;
  std::vector<Part> parts;
};

Due due_update(ChunkManager& chunks, ParamRecord& record, cpu::DType grad_dtype, int slots) {
  Due due;
  due.record = &record;
  due.grad_dtype = grad_dtype;
  // The arrays of an update, in acquire order, and their access.
  due.parts.push_back({record.managed->param_id, AccessMode::read_write,
                       record.count * bytes_per_element(record.dtype)});
  due.parts.push_back(
      {record.managed->grad_id, AccessMode::read, record.count * bytes_per_element(grad_dtype)});
  if (record.low_precision())
    due.parts.push_back({record.master, AccessMode::read_write, record.count * sizeof(float)});
  for (int slot = 0; slot < slots; ++slot)
    due.parts.push_back({record.state[slot], AccessMode::read_write, record.count * sizeof(float)});
  for (Part& part : due.parts) {
    const std::optional<TensorInfo> info = chunks.tensor_info(part.id);
    // Unknown places (or bytes other than the kernel's) join no run.
    part.placed = info && info->bytes == part.bytes;
    if (part.placed) {
      part.chunk = info->chunk;
      part.offset = info->offset;
    }
  }
  return due;
}

// Note [One kernel call per run]
// The kernels are elementwise, so parameters whose arrays follow each other
// in memory update with one call over the concatenated range, bit for bit as
// with one call each: fewer fixed costs (the pool's fork and join, the
// acquires' locks), which matter for the many small tensors of a transformer.
// A run is a sequence of a group's parameters, in the group's order, that
// share
//  - the group (options) and the state slots: runs never cross groups;
//  - the parameter and gradient dtypes (a master copy iff low precision);
//  - the step number and state_fresh: the bias correction and the first
//    step's initialisation are per call;
// and whose every array (param, grad, master, each state slot) starts in the
// same chunk where the previous parameter's ends. A parameter that does not
// step (no gradient, frozen, tied and stepped already) leaves a hole in the
// arrays and so cuts the run, as does the chunk packer's alignment padding
// after a tensor whose bytes are not a multiple of it. Each tensor is still
// acquired on its own, so every byte the kernel touches is in an acquired
// tensor; the addresses handed out are checked to be back to back too.
// grad_scale is the step's, the same for every run.
bool continues_run(const Due& previous, const Due& next) {
  const ParamRecord& a = *previous.record;
  const ParamRecord& b = *next.record;
  if (a.dtype != b.dtype || previous.grad_dtype != next.grad_dtype || a.step != b.step ||
      a.state_started != b.state_started || previous.parts.size() != next.parts.size())
    return false;
  for (std::size_t i = 0; i < previous.parts.size(); ++i) {
    const Part& before = previous.parts[i];
    const Part& after = next.parts[i];
    if (!before.placed || !after.placed || before.chunk != after.chunk ||
        before.offset + before.bytes != after.offset)
      return false;
  }
  return true;
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

  // Acquires a run's tensors (Note [One kernel call per run]), updates them
  // with one kernel call where Note [Where an update runs] says, and counts it.
  void update_run(ChunkedOptimizer& optimizer, ChunkManager& chunks,
                  const torch::optim::OptimizerOptions& options, int slots,
                  const std::vector<Due>& run, double grad_scale, bool on_cuda, std::size_t budget);
};

ChunkedOptimizer::ChunkedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                   std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                                   std::string kind)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)),
      impl_(std::make_unique<Impl>()) {
  impl_->name = torch_bridge::unique_client_name(kind);
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

  // Note [Optimizer state packed by owner]: the owners are looked up once,
  // and only when something is placed (every step calls this).
  std::optional<std::vector<int>> owners;
  auto pack_group_of = [&](std::size_t param_index) -> std::uint32_t {
    if (spillway::data_parallel_world_size() <= 1) return 0;
    if (!owners) {
      std::vector<torch::Tensor> params;
      for (const auto& group : param_groups_)
        for (const torch::Tensor& param : group.params()) params.push_back(param);
      owners = spillway::data_parallel_owners(params);
    }
    const int owner = (*owners)[param_index];
    return owner >= 0 ? static_cast<std::uint32_t>(owner) + 1 : 0;
  };

  // Note [Register a parameter's state before writing any].
  auto register_tensor = [&](TensorKind kind, std::uint32_t slot, std::size_t count,
                             const std::string& name, std::uint32_t pack_group) {
    TensorSpec spec;
    spec.kind = kind;
    spec.slot = slot;
    spec.dtype_bytes = sizeof(float);
    spec.element_count = count;
    spec.name = name;
    spec.pack_group = pack_group;
    TensorId id{};
    if (chunks.register_tensor(impl_->client, spec, &id) != Status::ok)
      throw chunk_failure("registering " + name);
    return id;
  };
  std::size_t param_index = 0;
  for (const auto& group : param_groups_) {
    const int slots = state_slots(group.options());
    for (const torch::Tensor& param : group.params()) {
      const std::size_t index = param_index++;
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
          created->master = register_tensor(TensorKind::master, 0, created->count,
                                            created->label + ".master", pack_group_of(index));
        }
        record = created.get();
        impl_->records.emplace(storage_of(param), std::move(created));
      }
      while (static_cast<int>(record->state.size()) < slots) {
        const auto slot = static_cast<std::uint32_t>(record->state.size());
        record->state.push_back(register_tensor(TensorKind::optimizer_state, slot, record->count,
                                                record->label + ".state" + std::to_string(slot),
                                                pack_group_of(index)));
      }
    }
  }
}

namespace {

// Note [A master copy starts at the first step]
// A low-precision parameter's fp32 master copy starts as the parameter's
// value, widened, at the first step that updates it, not when the optimizer
// places it: a rank then never writes the master chunks of what other ranks
// own (they take no memory), and a model loaded after the optimizer was
// built starts from the loaded weights. Until then param_state() reports
// the widened parameter as the master.
// The parameter's values widened to fp32 into `out`: what its master copy
// starts as.
void widen_param(ChunkManager& chunks, const ParamRecord& record, float* out) {
  Acquisitions host(chunks, /*on_host=*/true, Stream{});
  const void* param = host.acquire(record.managed->param_id, AccessMode::read, WaitMode::host);
  if (param == nullptr) throw chunk_failure("reading " + record.label);
  cpu::convert_to_float(param, record.dtype, out, record.count, torch_exec_config());
}

void fill_master_if_new(ChunkManager& chunks, ParamRecord& record) {
  if (!record.low_precision() || record.master_ready) return;
  Acquisitions host(chunks, /*on_host=*/true, Stream{});
  auto* master =
      static_cast<float*>(host.acquire(record.master, AccessMode::read_write, WaitMode::host));
  if (master == nullptr) throw chunk_failure("initialising the master copy of " + record.label);
  widen_param(chunks, record, master);
  record.master_ready = true;
}

}  // namespace

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
  // Note [Uses only the owner makes] (sharded_params.cc): each rank steps
  // what it owns.
  const torch_bridge::OwnerUses owner_uses;
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
    // The group's parameters that step now, in order, then cut into runs.
    std::vector<Due> due;
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
        throw std::runtime_error(
            "spillway optim: the gradient of " + record->label +
            " is not in its grad chunk: it is sparse, of another dtype or shape than the "
            "parameter, or the gradient before it is still held (`g = p.grad` kept across "
            "zero_grad and backward: Note [A replaced gradient someone holds keeps its values])");
      fill_master_if_new(chunks, *record);
      due.push_back(
          due_update(chunks, *record, kernel_dtype(grad.scalar_type(), "a gradient"), slots));
    }
    std::size_t begin = 0;
    while (begin < due.size()) {
      std::size_t end = begin + 1;
      while (end < due.size() && continues_run(due[end - 1], due[end])) ++end;
      const std::vector<Due> run(due.begin() + static_cast<std::ptrdiff_t>(begin),
                                 due.begin() + static_cast<std::ptrdiff_t>(end));
      impl_->update_run(*this, chunks, options, slots, run, grad_scale, on_cuda, budget);
      begin = end;
    }
  }
}

void ChunkedOptimizer::Impl::update_run(ChunkedOptimizer& optimizer, ChunkManager& chunks,
                                        const torch::optim::OptimizerOptions& options, int slots,
                                        const std::vector<Due>& run, double grad_scale,
                                        bool on_cuda, std::size_t budget) {
  const ParamRecord& first = *run.front().record;
  ChunkedOptimizer::Update update;
  for (const Due& due : run) update.count += due.record->count;
  update.grad_dtype = run.front().grad_dtype;
  update.params_low_dtype = first.dtype;
  update.grad_scale = static_cast<float>(grad_scale);
  update.step = first.step + 1;
  update.state_fresh = !first.state_started;
  const std::size_t arrays = run.front().parts.size();

  // Acquires every tensor of the run; the first parameter's addresses, or
  // empty when the chunk manager refused one.
  auto acquire_run = [&](Acquisitions& acquisitions, WaitMode wait) {
    std::vector<void*> starts(arrays, nullptr);
    std::vector<char*> ends(arrays, nullptr);
    for (const Due& due : run) {
      for (std::size_t i = 0; i < arrays; ++i) {
        const Part& part = due.parts[i];
        void* address = acquisitions.acquire(part.id, part.access, wait);
        if (address == nullptr) return std::vector<void*>{};
        if (starts[i] == nullptr) {
          starts[i] = address;
        } else if (address != ends[i]) {
          throw std::logic_error("spillway optim: the tensors of a run are not back to back (" +
                                 due.record->label + "); Note [One kernel call per run]");
        }
        ends[i] = static_cast<char*>(address) + part.bytes;
      }
    }
    return starts;
  };
  auto fill = [&](const std::vector<void*>& addresses) {
    update.params = static_cast<float*>(addresses[0]);
    update.grads = addresses[1];
    std::size_t next = 2;
    if (first.low_precision()) {
      update.params_low = addresses[0];
      update.params = static_cast<float*>(addresses[next++]);
    }
    for (int slot = 0; slot < slots; ++slot)
      update.state[slot] = static_cast<float*>(addresses[next++]);
  };

  // Note [Where an update runs]: the run's parameters share a chunk.
  bool done = false;
  const std::optional<TensorInfo> where = chunks.tensor_info(first.managed->param_id);
  if (where && where->location == Location::device) {
    std::unordered_set<std::uint32_t> distinct;
    std::size_t capacity = 0;
    for (const Due& due : run) {
      for (const Part& part : due.parts) {
        const std::optional<TensorInfo> info = chunks.tensor_info(part.id);
        if (!info || !distinct.insert(static_cast<std::uint32_t>(info->chunk)).second) continue;
        if (const std::optional<ChunkInfo> chunk = chunks.chunk_info(info->chunk))
          capacity += chunk->capacity_bytes;
      }
    }
    if (capacity <= budget) {
      const Stream stream{};
      Acquisitions device(chunks, /*on_host=*/false, stream);
      const std::vector<void*> addresses =
          acquire_run(device, on_cuda ? WaitMode::stream : WaitMode::host);
      if (!addresses.empty()) {
        fill(addresses);
        optimizer.run_update(
            options, update,
            on_cuda ? ChunkedOptimizer::Target::cuda : ChunkedOptimizer::Target::cpu,
            stream.handle);
        placement.device += static_cast<std::int64_t>(run.size());
        done = true;
      }
    }
  }
  if (!done) {
    torch_bridge::HostWorkScope host_work;  // Note [Host work is not device memory]
    Acquisitions host(chunks, /*on_host=*/true, Stream{});
    const std::vector<void*> addresses = acquire_run(host, WaitMode::host);
    if (addresses.empty()) throw chunk_failure("acquiring the tensors of " + first.label);
    fill(addresses);
    optimizer.run_update(options, update, ChunkedOptimizer::Target::cpu, nullptr);
    placement.host += static_cast<std::int64_t>(run.size());
  }
  ++placement.kernel_calls;
  for (const Due& due : run) {
    due.record->step = update.step;
    if (slots > 0) due.record->state_started = true;
  }
}

GradientSummary ChunkedOptimizer::gradient_summary(double grad_scale) {
  at::NoGradGuard no_grad;
  place_all();
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  const bool sim = Runtime::process().device().kind() == DeviceKind::sim;
  // Per parameter, in order: its sum of squares, where this rank holds its
  // gradient (Note [Per-parameter figures summed over owners]).
  std::vector<std::optional<double>> sums_of_squares;
  bool found_inf = false;
  std::unordered_set<const ParamRecord*> seen;
  for (const auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) {
      ParamRecord* record = impl_->find(param);
      if (record == nullptr || !seen.insert(record).second) continue;
      check_still_managed(*record);
      torch_bridge::rebind_grad_if_replaced(chunks, *record->managed);
      std::optional<double>& sum_squares = sums_of_squares.emplace_back();
      const torch::Tensor grad = param.grad();
      if (!grad.defined()) continue;
      if (!grad.has_storage() || storage_of(grad) != record->managed->bound_grad_storage)
        throw std::runtime_error("spillway optim: the gradient of " + record->label +
                                 " is not in its grad chunk (Note [A replaced gradient "
                                 "someone holds keeps its values])");
      const TensorId id = record->managed->grad_id;
      const std::optional<TensorInfo> info = chunks.tensor_info(id);
      // On the sim device a resident gradient is read where it is; on a GPU
      // it is read on the host (a copy back; no reduction kernel yet).
      const bool in_place = sim && info && info->location == Location::device;
      std::optional<torch_bridge::HostWorkScope>
          host_work;  // Note [Host work is not device memory]
      if (!in_place) host_work.emplace();
      Acquisitions access(chunks, /*on_host=*/!in_place, Stream{});
      const void* data = access.acquire(id, AccessMode::read, WaitMode::host);
      if (data == nullptr) throw chunk_failure("reading the gradient of " + record->label);
      const cpu::GradStats stats = cpu::grad_stats(
          data, kernel_dtype(grad.scalar_type(), "a gradient"), record->count, torch_exec_config());
      sum_squares = stats.sum_squares;
      found_inf = found_inf || stats.found_inf;
    }
  }
  // Under data parallel training, every rank's part: the norm and the
  // overflow of the mean gradient, the same on every rank.
  sums_of_squares = torch_bridge::owned_figures_everywhere(std::move(sums_of_squares),
                                                           "gradients' sums of squares");
  found_inf = torch_bridge::on_any_rank(found_inf, "a gradient overflowed");
  double sum_squares = 0.0;
  for (const std::optional<double>& figure : sums_of_squares)
    if (figure.has_value()) sum_squares += *figure;
  return {std::sqrt(sum_squares) * std::fabs(grad_scale), found_inf};
}

std::optional<ChunkedOptimizer::ParamState> ChunkedOptimizer::param_state(
    const torch::Tensor& param) const {
  const ParamRecord* record = impl_->find(param);
  if (record == nullptr) return std::nullopt;
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  torch_bridge::HostWorkScope host_work;  // Note [Host work is not device memory]
  const auto count = static_cast<std::int64_t>(record->count);
  ParamState state;
  state.step = record->step;
  state.started = record->state_started;
  for (const TensorId slot : record->state) {
    torch::Tensor values = torch::empty({count}, torch::kFloat);
    read_chunk_tensor(chunks, slot, values.data_ptr(), record->count * sizeof(float));
    state.slots.push_back(std::move(values));
  }
  // Not yet stepped, and its values on their owner alone (dist_params:
  // sharded: Note [Parameters gathered for their use]): no master to widen.
  const ManagedParam& managed = *record->managed;
  const bool values_elsewhere = managed.shard_dropped.load(std::memory_order_acquire) &&
                                !managed.shard_owned.load(std::memory_order_acquire);
  if (record->low_precision() && (record->master_ready || !values_elsewhere)) {
    state.master = torch::empty({count}, torch::kFloat);
    if (record->master_ready) {
      read_chunk_tensor(chunks, record->master, state.master.data_ptr(),
                        record->count * sizeof(float));
    } else {  // Note [A master copy starts at the first step]
      widen_param(chunks, *record, state.master.data_ptr<float>());
    }
  }
  return state;
}

void ChunkedOptimizer::set_param_state(const torch::Tensor& param, const ParamState& state) {
  at::NoGradGuard no_grad;
  torch_bridge::HostWorkScope host_work;  // Note [Host work is not device memory]
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
    record->master_ready = true;
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
  torch_bridge::HostWorkScope host_work;  // Note [Host work is not device memory]
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
