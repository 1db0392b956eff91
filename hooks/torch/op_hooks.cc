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
//  - Note [Ops that touch no bytes]: a view op (t, transpose, detach: its
//    outputs alias its inputs, it writes none) and an in-place one that
//    changes only a tensor's metadata (detach_, t_, squeeze_: torch's
//    inplace_view tag, less set_ and resize_, which change the storage)
//    acquire nothing: they read no bytes, so their chunks need not be
//    resident, and an access there would tell the policy of a use that is
//    none. LibTorch's zero_grad calls detach_ on every gradient before it
//    drops it: each was an access, so the policy kept gradient chunks on the
//    device for it (Belady saw a use at the next step's start), and an
//    evicted one was fetched to be detached and then discarded. The ops that
//    do read, inside a composite one (contiguous's clone), are hooked on
//    their own.
//  - Note [Set-to-none zero_grad] (grad_binding.cc): when an op uses
//    a managed parameter whose param.grad autograd replaced, the fresh
//    gradient is copied into its grad chunk first.
//  - After `param.set_(t)` (torch::load into a module), new data of the
//    parameter's layout goes into its chunk (Note [set_ on a managed
//    parameter] below).
//  - Note [Traced ops]: when the `trace` option is set (Runtime::op_tracer()
//    non-null), an op with managed inputs is bracketed by op_begin before its
//    acquires and op_end after its releases (Note [Op events] in
//    tracer/op_tracer.h), so its chunk_access/chunk_release records and the
//    fetches they cause fall inside. A thread-local holds the innermost traced
//    op, the parent of the next. Without a trace this costs one null check
//    per op with managed inputs.
//  - Note [An op never runs on bytes that are not resident]: torch's
//    RecordFunction swallows an exception thrown by a callback, so a hook
//    cannot fail the op. Its acquires therefore pass OverBudget::overrun:
//    when every resident chunk is in compute, the chunk comes in past the
//    budget, and the hook warns with the op and the bytes (the first time
//    per op name; the rest are counted in num_budget_overruns). An acquire
//    that fails even so (the device itself is full, the chunk is in use on
//    the host) stops the process with the error: the op would otherwise
//    compute on bytes that are not there. Each op also reports the chunks it
//    needs at once, with those of the ops around it on its thread (Note [The
//    smallest budget] in chunk_reports.cc); a budget below that is an error
//    at the step boundary (check_budget_fits_ops in manage.cc).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/enum_tag.h>
#include <ATen/record_function.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/version.h>

#include "allocator/config/format_bytes.h"
#include "allocator/config/log.h"
#include "hooks/torch/bridge.h"
#include "hooks/torch/op_gpu_timing.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway::torch_bridge {

namespace {

thread_local bool t_hook_suppressed = false;
// Note [Traced ops]: the sequence number of this thread's innermost traced op.
thread_local std::uint64_t t_current_op = 0;
// Note [An op never runs on bytes that are not resident]: the tensors that the
// ops running on this thread hold, outermost first. Values, not pointers to
// the ops' contexts, so an op that ends out of order leaves nothing dangling.
thread_local std::vector<TensorId> t_held_by_enclosing_ops;

// Note [Which inputs an op writes].
struct OpWrites {
  std::vector<bool> argument_written;
  bool varargs_written = false;   // inputs past the schema's arguments
  bool touches_no_bytes = false;  // Note [Ops that touch no bytes]
  bool written(std::size_t input) const {
    return input < argument_written.size() ? argument_written[input] : varargs_written;
  }
};

// Note [Ops that touch no bytes].
bool touches_no_bytes(const c10::FunctionSchema& schema) {
  const std::string& name = schema.name();
  if (name == "aten::set_" || name == "aten::resize_" || name == "aten::resize_as_") return false;
  const std::optional<c10::OperatorHandle> handle =
      c10::Dispatcher::singleton().findOp(schema.operator_name());
  if (handle && handle->hasTag(at::Tag::inplace_view)) return true;
  if (schema.returns().empty() || schema.is_vararg()) return false;
  for (const c10::Argument& argument : schema.arguments()) {
    const c10::AliasInfo* alias = argument.alias_info();
    if (alias != nullptr && alias->isWrite()) return false;
  }
  for (const c10::Argument& output : schema.returns()) {
    const c10::AliasInfo* alias = output.alias_info();
    if (alias == nullptr || alias->isWrite()) return false;  // a new tensor: computed
  }
  return true;
}

// Note [Ops that touch no bytes]: autograd's own records of detach and
// detach_ (VariableTypeManual.cpp), around the aten ops, carry no schema.
bool schema_less_view(const char* name) {
  return std::strcmp(name, "detach") == 0 || std::strcmp(name, "detach_") == 0;
}

std::shared_ptr<const OpWrites> metadata_only() {
  static const auto* const writes = new std::shared_ptr<const OpWrites>(
      std::make_shared<const OpWrites>(OpWrites{.touches_no_bytes = true}));
  return *writes;
}

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
    if (!schema) return schema_less_view(key) ? metadata_only() : nullptr;
    auto writes = std::make_shared<OpWrites>();
    for (const c10::Argument& argument : schema->arguments()) {
      const c10::AliasInfo* alias = argument.alias_info();
      writes->argument_written.push_back(alias != nullptr && alias->isWrite());
    }
    writes->varargs_written = schema->is_vararg();
    writes->touches_no_bytes = touches_no_bytes(*schema);
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
  std::size_t enclosing_held = 0;  // t_held_by_enclosing_ops's size before this op
  // Note [set_ on a managed parameter]: the parameter this op is set_ on.
  std::shared_ptr<ManagedParam> set_on;
};

// Note [set_ on a managed parameter]
// `param.set_(t)` gives the parameter t's storage; torch::load into an existing
// module does it for every parameter (InputArchive::read). Unlike set_data
// (Note [set_data on a managed parameter, at the call], set_data_hook.cc) it
// is an op, so the op hook sees it: once it has run, new data of the
// parameter's layout goes into the chunk and the parameter points there
// again. An op cannot be refused (a hook cannot fail it), so new data of
// another layout stays the parameter's own, and the step boundary raises
// (Note [set_data on a managed parameter] in param_rebinding.cc).
std::shared_ptr<ManagedParam> set_on_managed_param(const at::RecordFunction& fn) {
  const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
  if (inputs.empty() || !inputs[0].isTensor() || std::strcmp(fn.name(), "aten::set_") != 0)
    return nullptr;
  return managed_param_bound_to(inputs[0].toTensor());
}

// Another layout: rebind_param_if_replaced throws, naming the parameter.
void rebind_after_set(const at::RecordFunction& fn, ChunkManager& chunks, ManagedParam& managed) {
  try {
    rebind_param_if_replaced(chunks, managed);
  } catch (const std::exception& e) {
    // Nothing is lost: the parameter keeps the new data, which ops use as
    // torch would; spillway::step() tries again and raises.
    SPILLWAY_LOG(warn, "op {}: {}; the parameter keeps its new data until the step", fn.name(),
                 e.what());
  }
}

// Note [An op never runs on bytes that are not resident].
[[noreturn]] void stop_before_op(const at::RecordFunction& fn, const std::string& why) {
  SPILLWAY_LOG(error,
               "op {}: acquiring a managed input failed: {}. Stopping the process: the op "
               "would otherwise compute on bytes that are not resident, and a hook cannot fail it",
               fn.name(), why);
  std::fflush(stderr);
  std::abort();
}

void warn_overrun(const at::RecordFunction& fn, std::size_t over_bytes, ChunkManager& chunks) {
  static std::mutex mutex;
  static std::set<std::string, std::less<>> warned;  // op names
  {
    std::lock_guard lock(mutex);
    if (!warned.emplace(fn.name()).second) return;
  }
  // The budget must hold the chunks an op needs at once and, beside them,
  // the memory outside chunks: advice from min_budget_bytes alone can be
  // less than the budget that just overran.
  const Stats stats = Runtime::process().stats();
  const auto outside =
      static_cast<std::size_t>(std::max<std::int64_t>(0, stats.allocated_bytes_non_model.current));
  SPILLWAY_LOG(warn,
               "op {}: its managed inputs did not fit in the device budget of {} with every "
               "resident chunk in compute, so they were made resident {} past it. Raise "
               "device_budget above {}: it holds the chunks ops need at once (min_budget_bytes "
               "in memory_stats(), now {}) and, beside them, the memory outside chunks "
               "(activations and temporaries, now {}). Further overruns are counted in "
               "num_budget_overruns",
               fn.name(), format_bytes(chunks.effective_budget_bytes()), format_bytes(over_bytes),
               format_bytes(chunks.effective_budget_bytes() + over_bytes),
               format_bytes(chunks.min_budget_bytes()), format_bytes(outside));
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
  if (writes != nullptr && writes->touches_no_bytes) return nullptr;

  // Note [Parameters gathered for their use] (sharded_params.cc): before
  // anything is acquired, so that the gather's own ops find them present.
  c10::SmallVector<ManagedParam*, 4> params;
  for (const ManagedInput& input : managed)
    if (input.binding.managed != nullptr && input.binding.kind == TensorKind::param)
      params.push_back(input.binding.managed.get());
  if (!params.empty()) {
    try {
      gather_for_op(params);
    } catch (const std::exception& e) {
      stop_before_op(fn, e.what());
    }
  }

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
  std::size_t overrun_bytes = 0;
  for (ManagedInput& input : managed) {
    if (input.binding.managed != nullptr && input.binding.kind == TensorKind::param) {
      // Note [A gradient set to none is not fetched] (dead_gradients.cc).
      discard_dead_gradients_once_per_step(chunks, input.binding.managed->client,
                                           DeadGradientCheck::first_param_use);
      // Note [A parameter unfrozen after manage()] (manage.cc): throws only
      // when registering fails, which the op cannot go on without.
      give_gradient_if_unfrozen(chunks, input.binding.managed);
      try {
        rebind_grad_if_replaced(chunks, *input.binding.managed);
      } catch (const std::exception& e) {
        // Nothing is lost: param.grad stays autograd's tensor, which the op
        // reads as torch would; the step boundary copies it in again and
        // raises if that fails too (spillway::step()).
        SPILLWAY_LOG(warn, "op {}: {}; the gradient stays in its own tensor until the step",
                     fn.name(), e.what());
      }
    }
    void* address = nullptr;
    const AccessMode access = input.written ? AccessMode::read_write : AccessMode::read;
    const OpStream on = op_stream(input.binding.device);
    if (chunks.acquire(input.binding.tensor, on.stream, &address, access, on.wait,
                       OverBudget::overrun) != Status::ok)
      stop_before_op(fn, ChunkManager::last_error());
    acquisitions->acquired.emplace_back(input.binding.tensor, on.stream);
    if (const std::size_t over = ChunkManager::last_overrun_bytes(); over > 0)
      overrun_bytes = std::max(overrun_bytes, over);
  }
  // Note [The smallest budget]: this op's chunks with those its enclosing ops hold.
  acquisitions->enclosing_held = t_held_by_enclosing_ops.size();
  for (const auto& [tensor, stream] : acquisitions->acquired)
    t_held_by_enclosing_ops.push_back(tensor);
  chunks.note_working_set(t_held_by_enclosing_ops, fn.name());
  if (overrun_bytes > 0) warn_overrun(fn, overrun_bytes, chunks);
  acquisitions->set_on = set_on_managed_param(fn);
  return acquisitions;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* acquisitions = static_cast<OpAcquisitions*>(context);
  if (acquisitions == nullptr) return;
  if (t_held_by_enclosing_ops.size() > acquisitions->enclosing_held)
    t_held_by_enclosing_ops.resize(acquisitions->enclosing_held);
  Runtime& runtime = Runtime::process();
  ChunkManager& chunks = runtime.chunk_manager();
  for (const auto& [tensor, stream] : acquisitions->acquired) {
    if (chunks.release(tensor, stream) != Status::ok)
      SPILLWAY_LOG(error, "op {}: releasing a managed input failed: {}", fn.name(),
                   ChunkManager::last_error());
  }
  if (acquisitions->set_on != nullptr) rebind_after_set(fn, chunks, *acquisitions->set_on);
  if (const std::optional<TracedOp>& op = acquisitions->traced) {
    OpGpuTiming& gpu_timing = OpGpuTiming::process();
    if (gpu_timing.recording()) gpu_timing.pop_op();
    runtime.op_tracer()->end(*op, runtime.device().now_ns());
    if (t_current_op == op->sequence) t_current_op = op->parent;
  }
}

}  // namespace

// Note [The op's stream].
OpStream op_stream(c10::Device device) {
  if (device.is_cuda()) {
    const c10::impl::VirtualGuardImpl cuda(c10::DeviceType::CUDA);
    return {Stream{cuda.getStream(device).native_handle()}, WaitMode::stream};
  }
  return {};
}

OpHookSuppression::OpHookSuppression() : previous_(t_hook_suppressed) { t_hook_suppressed = true; }
OpHookSuppression::~OpHookSuppression() { t_hook_suppressed = previous_; }
bool OpHookSuppression::active() { return t_hook_suppressed; }

void install_op_hooks() {
  at::addGlobalCallback(
      at::RecordFunctionCallback(&on_op_start, &on_op_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

}  // namespace spillway::torch_bridge
