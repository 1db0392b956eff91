// spillway._C: the extension module under the Python package (python/spillway).
//
// Note [One runtime per process]
// The module holds spillway's runtime (it links the torch bridge and the
// allocator statically). On a GPU, the package installs the bridge's
// TorchCudaAllocator (use_as_torch_cuda_allocator) from this module, so
// torch's allocations and the chunk manager share one runtime and one budget.
// It also exports the C ABI (allocator/spillway.cc is one of its sources): a
// build without torch's CUDA side hands this very file to
// torch.cuda.memory.CUDAPluggableAllocator instead, and dlopen of a loaded
// library returns the same handle, so the runtime is the same one.
#include "python/bindings/bindings.h"

PYBIND11_MODULE(_C, module) {
  module.doc() = "spillway's extension module; use the spillway package instead";
  spillway::python::bind_runtime(module);
  spillway::python::bind_optimizers(module);
  spillway::python::bind_engine(module);
}
