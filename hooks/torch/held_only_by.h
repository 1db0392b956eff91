// Counting the references to a tensor or storage that the bridge holds, to
// tell bytes nothing else can read (Note [A parameter only the bridge holds
// goes] in dropped_params.cc, Note [A gradient set to none is not fetched] in
// dead_gradients.cc).
#pragma once

#include <cstddef>

#include <c10/core/impl/PyObjectSlot.h>
#include <c10/util/intrusive_ptr.h>

namespace spillway::torch_bridge {

// Whether `target` (a TensorImpl or a StorageImpl) is referenced by exactly
// `refs` of the bridge's and nothing else. Its Python object, if it has one,
// holds one reference of its own (torch's PyObject preservation), and is
// held by nothing in Python when its only reference is the one C++ holds to
// keep it alive while C++ holds the target. The bridge reads that refcount
// without the GIL: at 1 no Python code holds the object, and above 1 the
// target is kept either way. The one way back to an object no one holds is
// a Python weak reference to it, called on another thread in the instant
// between this check and the drop: not guarded against.
template <typename Target>
bool held_only_by(Target* target, std::size_t refs) {
  const c10::impl::PyObjectSlot* slot = target->pyobj_slot();
  const bool has_python_object = slot->load_pyobj() != nullptr;
  if (c10::raw::intrusive_ptr::use_count(target) != refs + (has_python_object ? 1 : 0))
    return false;
  return !has_python_object || slot->has_unique_reference();
}

}  // namespace spillway::torch_bridge
