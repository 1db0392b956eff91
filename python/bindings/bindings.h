// bindings.h: the parts of the extension module spillway._C, one file each.
#pragma once

#include <torch/python.h>

namespace spillway::python {

namespace py = pybind11;

// The runtime: configure, activate, manage, statistics, trace, step (runtime_bindings.cc).
void bind_runtime(py::module_& module);
// The chunked optimizers behind spillway.optim (optimizer_bindings.cc).
void bind_optimizers(py::module_& module);
// The engine behind spillway.initialize (engine_bindings.cc).
void bind_engine(py::module_& module);

}  // namespace spillway::python
