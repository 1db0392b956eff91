// spillway._C: the extension module under the Python package (python/spillway).
//
// Note [One runtime per process]
// The module holds spillway's runtime (it links the torch bridge and the
// allocator statically) and exports the C ABI (allocator/spillway.cc is one of
// its sources). On a GPU, the package hands this very file to
// torch.cuda.memory.CUDAPluggableAllocator: dlopen of a loaded library returns
// the same handle, so torch's allocations and the chunk manager share one
// runtime and one budget.
#include "python/bindings/bindings.h"

PYBIND11_MODULE(_C, module) {
  module.doc() = "spillway's extension module; use the spillway package instead";
  spillway::python::bind_runtime(module);
  spillway::python::bind_optimizers(module);
  spillway::python::bind_engine(module);
}
