// Op hooks: a global at::RecordFunction callback that acquires the chunks of
// an op's managed tensor inputs before the op runs and releases them after.
//
// Design summary:
//  - Every op dispatched on any thread, forward or backward, reaches
//    on_op_start with its boxed inputs. Each Tensor input (also inside
//    TensorLists and lists of optional tensors) is looked up by its
//    StorageImpl (Note [Bindings are keyed by StorageImpl]); nothing is
//    looked up while nothing is managed.
//  - Note [The op's stream]: a managed input on the CPU (the sim device) is
//    acquired with WaitMode::host: CPU kernels read the bytes from the host.
//    On CUDA it is acquired on the op's current stream with WaitMode::stream,
//    so the stream, not the host, waits for a fetch, and released on that
//    stream, so an eviction waits for the op's kernels. The release is in on_op_end,
//    which RecordFunction runs even when the op throws. Nested ops (linear ->
//    addmm) acquire again: acquires nest in the chunk manager.
//  - Note [Which inputs an op writes]: an input whose schema argument is
//    annotated as written (`Tensor(a!)`: in-place ops, out= variants,
//    optimizer updates like add_ into a gradient) is acquired read_write,
//    which marks its chunk dirty; every other one is acquired for reading,
//    so evicting its chunk needs no write-back. Records without a schema
//    (autograd nodes, user scopes) acquire for reading: the ops inside them
//    are hooked on their own. The answer is cached per schema, keyed by the
//    schema's name pointer, which lives as long as the operator.
//  - Note [Set-to-none zero_grad] (grad_binding.cc): when an op uses
//    a managed parameter whose param.grad autograd replaced, the fresh
//    gradient is copied into its grad chunk first.
//  - Note [Traced ops]: when the `trace` option is set (Runtime::op_tracer()
//    non-null), an op with managed inputs is bracketed by op_begin before its
//    acquires and op_end after its releases (Note [Op events] in
//    tracer/op_tracer.h), so its chunk_access/chunk_release records and the
//    fetches they cause fall inside. A thread-local holds the innermost traced
//    op, the parent of the next. Without a trace this costs one null check
//    per op with managed inputs.
//  - Note [Python optimizers mark the step]: torch.optim wraps every
//    optimizer's step in a record function named "Optimizer.step#<Class>.step"
//    (user scope). Its end is the iteration boundary, so a second callback
//    calls spillway::step() there and a Python training loop needs no call of
//    its own. The callback looks at nothing but the name.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/version.h>

#include "allocator/config/log.h"
#include "hooks/torch/bridge.h"
#include "hooks/torch/op_gpu_timing.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

thread_local bool t_hook_suppressed = false;
// Note [Traced ops]: the sequence number of this thread's innermost traced op.
thread_local std::uint64_t t_current_op = 0;

// Note [Which inputs an op writes].
struct OpWrites {
  std::vector<bool> argument_written;
  bool varargs_written = false;  // inputs past the schema's arguments
  bool written(std::size_t input) const {
    return input < argument_written.size() ? argument_written[input] : varargs_written;
  }
};

class OpWritesCache {
 public:
  // Null for a record without a schema.
  std::shared_ptr<const OpWrites> lookup(const at::RecordFunction& fn) {
    const char* key = fn.name();
    {
      std::shared_lock lock(mutex_);
      if (const auto found = by_name_.find(key); found != by_name_.end()) return found->second;
    }
    const c10::optional<c10::FunctionSchema> schema = fn.operator_schema();
    if (!schema) return nullptr;
    auto writes = std::make_shared<OpWrites>();
    for (const c10::Argument& argument : schema->arguments()) {
      const c10::AliasInfo* alias = argument.alias_info();
      writes->argument_written.push_back(alias != nullptr && alias->isWrite());
    }
    writes->varargs_written = schema->is_vararg();
    std::unique_lock lock(mutex_);
    by_name_.emplace(key, writes);
    return writes;
  }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<const char*, std::shared_ptr<const OpWrites>> by_name_;
};

OpWritesCache& op_writes_cache() {
  static OpWritesCache* const cache = new OpWritesCache();  // never destroyed
  return *cache;
}

// One managed storage an op uses, and whether it writes it.
struct ManagedInput {
  Binding binding;
  bool written = false;
};

// What on_op_end releases, and on which stream; the op when traced.
struct OpAcquisitions final : at::ObserverContext {
  c10::SmallVector<std::pair<TensorId, Stream>, 4> acquired;
  std::optional<TracedOp> traced;  // Note [Traced ops]
};

struct OpStream {
  Stream stream;
  WaitMode wait = WaitMode::host;
};

// Note [The op's stream].
OpStream op_stream(c10::Device device) {
  if (device.is_cuda()) {
    const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    return {Stream{cuda.getStream(device).native_handle()}, WaitMode::stream};
  }
  return {};
}

void note_tensor(const at::Tensor& tensor, std::size_t input, const at::RecordFunction& fn,
                 std::shared_ptr<const OpWrites>& writes, bool& writes_looked_up,
                 c10::SmallVector<ManagedInput, 4>& managed) {
  if (!tensor.defined() || !tensor.has_storage()) return;
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  std::optional<Binding> binding = binding_table().find(storage);
  if (!binding) return;
  if (!writes_looked_up) {
    writes = op_writes_cache().lookup(fn);
    writes_looked_up = true;
  }
  const bool written = writes != nullptr && writes->written(input);
  for (ManagedInput& seen : managed) {
    if (seen.binding.storage.get() == storage) {
      seen.written = seen.written || written;
      return;
    }
  }
  managed.push_back(ManagedInput{std::move(*binding), written});
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  if (t_hook_suppressed || binding_table().empty()) return nullptr;
  c10::SmallVector<ManagedInput, 4> managed;
  std::shared_ptr<const OpWrites> writes;
  bool writes_looked_up = false;
  const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const c10::IValue& input = inputs[i];
    if (input.isTensor()) {
      note_tensor(input.toTensor(), i, fn, writes, writes_looked_up, managed);
    } else if (input.isTensorList()) {
      for (const at::Tensor& tensor : input.toTensorList().vec())
        note_tensor(tensor, i, fn, writes, writes_looked_up, managed);
    } else if (input.isList()) {
      for (const c10::IValue& element : input.toListRef())
        if (element.isTensor())
          note_tensor(element.toTensor(), i, fn, writes, writes_looked_up, managed);
    }
  }
  if (managed.empty()) return nullptr;

  Runtime& runtime = Runtime::process();
  ChunkManager& chunks = runtime.chunk_manager();
  auto acquisitions = std::make_unique<OpAcquisitions>();
  if (OpTracer* tracer = runtime.op_tracer()) {
    acquisitions->traced =
        tracer->begin(fn.name(), t_current_op, trace_thread_id(), runtime.device().now_ns());
    t_current_op = acquisitions->traced->sequence;
    OpGpuTiming& gpu_timing = OpGpuTiming::process();
    if (gpu_timing.recording()) gpu_timing.push_op(t_current_op);  // op_gpu_timing.h
  }
  for (ManagedInput& input : managed) {
    if (input.binding.managed != nullptr && input.binding.kind == TensorKind::param) {
      try {
        rebind_grad_if_replaced(chunks, *input.binding.managed);
      } catch (const std::exception& e) {
        SPILLWAY_LOG(error, "op {}: {}", fn.name(), e.what());
      }
    }
    void* address = nullptr;
    const AccessMode access = input.written ? AccessMode::read_write : AccessMode::read;
    const OpStream on = op_stream(input.binding.device);
    if (chunks.acquire(input.binding.tensor, on.stream, &address, access, on.wait) != Status::ok) {
      SPILLWAY_LOG(error, "op {}: acquiring a managed input failed: {}", fn.name(),
                   ChunkManager::last_error());
      continue;
    }
    acquisitions->acquired.emplace_back(input.binding.tensor, on.stream);
  }
  return acquisitions;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* acquisitions = static_cast<OpAcquisitions*>(context);
  if (acquisitions == nullptr) return;
  Runtime& runtime = Runtime::process();
  ChunkManager& chunks = runtime.chunk_manager();
  for (const auto& [tensor, stream] : acquisitions->acquired) {
    if (chunks.release(tensor, stream) != Status::ok)
      SPILLWAY_LOG(error, "op {}: releasing a managed input failed: {}", fn.name(),
                   ChunkManager::last_error());
  }
  if (const std::optional<TracedOp>& op = acquisitions->traced) {
    OpGpuTiming& gpu_timing = OpGpuTiming::process();
    if (gpu_timing.recording()) gpu_timing.pop_op();
    runtime.op_tracer()->end(*op, runtime.device().now_ns());
    if (t_current_op == op->sequence) t_current_op = op->parent;
  }
}

// Note [Python optimizers mark the step].
constexpr std::string_view kOptimizerStepPrefix = "Optimizer.step#";

std::unique_ptr<at::ObserverContext> on_user_scope_start(const at::RecordFunction&) {
  return nullptr;
}

void on_user_scope_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_hook_suppressed || std::string_view(fn.name()).rfind(kOptimizerStepPrefix, 0) != 0) return;
  try {
    spillway::step();
  } catch (const std::exception& e) {
    SPILLWAY_LOG(error, "{}: marking the step failed: {}", fn.name(), e.what());
  }
}

}  // namespace

OpHookSuppression::OpHookSuppression() : previous_(t_hook_suppressed) { t_hook_suppressed = true; }
OpHookSuppression::~OpHookSuppression() { t_hook_suppressed = previous_; }
bool OpHookSuppression::active() { return t_hook_suppressed; }

void install_op_hooks() {
  at::addGlobalCallback(
      at::RecordFunctionCallback(&on_op_start, &on_op_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  at::addGlobalCallback(at::RecordFunctionCallback(&on_user_scope_start, &on_user_scope_end)
                            .scopes({at::RecordScope::USER_SCOPE}));
}

}  // namespace spillway::torch_bridge
