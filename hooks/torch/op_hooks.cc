// Op hooks: a global at::RecordFunction callback that acquires the chunks of
// an op's managed tensor inputs before the op runs and releases them after.
//
// Design summary:
//  - Every op dispatched on any thread, forward or backward, reaches
//    on_op_start with its boxed inputs. Each Tensor input (also inside
//    TensorLists and lists of optional tensors) is looked up by its
//    StorageImpl (Note [Bindings are keyed by StorageImpl]); nothing is
//    looked up while nothing is managed.
//  - A managed input is acquired with WaitMode::host (CPU kernels on the sim
//    device read the bytes from the host) and released in on_op_end, which
//    RecordFunction runs even when the op throws. Nested ops (linear ->
//    addmm) acquire again: acquires nest in the chunk manager.
//  - Note [Which inputs an op writes]: an input whose schema argument is
//    annotated as written (`Tensor(a!)`: in-place ops, out= variants,
//    optimizer updates like add_ into a gradient) is acquired read_write,
//    which marks its chunk dirty; every other one is acquired for reading,
//    so evicting its chunk needs no write-back. Records without a schema
//    (autograd nodes, user scopes) acquire for reading: the ops inside them
//    are hooked on their own. The answer is cached per schema, keyed by the
//    schema's name pointer, which lives as long as the operator.
//  - Note [Gradients replaced by autograd] (grad_binding.cc): when an op uses
//    a managed parameter whose param.grad autograd replaced, the fresh
//    gradient is copied into its grad chunk first.
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include "allocator/log.h"
#include "hooks/torch/bridge.h"

namespace spillway::torch_bridge {

namespace {

thread_local bool t_hook_suppressed = false;

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

// What on_op_end releases.
struct OpAcquisitions final : at::ObserverContext {
  c10::SmallVector<TensorId, 4> acquired;
};

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

  ChunkManager& chunks = Runtime::process().chunk_manager();
  auto acquisitions = std::make_unique<OpAcquisitions>();
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
    if (chunks.acquire(input.binding.tensor, Stream{}, &address, access, WaitMode::host) !=
        Status::ok) {
      SPILLWAY_LOG(error, "op {}: acquiring a managed input failed: {}", fn.name(),
                   ChunkManager::last_error());
      continue;
    }
    acquisitions->acquired.push_back(input.binding.tensor);
  }
  return acquisitions;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext* context) {
  auto* acquisitions = static_cast<OpAcquisitions*>(context);
  if (acquisitions == nullptr) return;
  ChunkManager& chunks = Runtime::process().chunk_manager();
  for (const TensorId tensor : acquisitions->acquired) {
    if (chunks.release(tensor, Stream{}) != Status::ok)
      SPILLWAY_LOG(error, "op {}: releasing a managed input failed: {}", fn.name(),
                   ChunkManager::last_error());
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
}

}  // namespace spillway::torch_bridge
