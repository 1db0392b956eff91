// The engine behind spillway.initialize: the Python package parses nothing
// itself; the DeepSpeed-style configuration is checked here (errors name the
// key), the package casts the model to the compute dtype, and EngineCore
// takes the named parameters.
#include <string>
#include <utility>
#include <vector>

#include "hooks/engine/engine_config.h"
#include "hooks/torch/engine.h"
#include "python/bindings/bindings.h"

namespace spillway::python {

namespace {

const char* dtype_name(engine::Precision precision) {
  switch (precision) {
    case engine::Precision::bf16:
      return "bfloat16";
    case engine::Precision::fp16:
      return "float16";
    case engine::Precision::f32:
      break;
  }
  return "float32";
}

}  // namespace

void bind_engine(py::module_& module) {
  module.def(
      "engine_compute_dtype",
      [](const std::string& json) {
        return dtype_name(engine::parse_engine_config(json).precision);
      },
      py::arg("config_json"),
      "The torch dtype name a configuration computes in; ValueError naming a bad key.");
  py::class_<EngineCore>(module, "EngineCore")
      .def(py::init(
               [](std::vector<std::pair<std::string, at::Tensor>> named, const std::string& json) {
                 engine::EngineConfig config = engine::parse_engine_config(json);
                 py::gil_scoped_release release;
                 return std::make_unique<EngineCore>(std::move(named), std::move(config));
               }),
           py::arg("named_params"), py::arg("config_json"))
      .def("backward", &EngineCore::backward, py::arg("loss"),
           py::call_guard<py::gil_scoped_release>())
      .def("step", &EngineCore::step, py::call_guard<py::gil_scoped_release>())
      .def("is_gradient_accumulation_boundary", &EngineCore::is_gradient_accumulation_boundary)
      .def_property_readonly("loss_scale", &EngineCore::loss_scale)
      .def_property_readonly("last_gradient_norm", &EngineCore::last_gradient_norm)
      .def_property_readonly("global_steps", &EngineCore::global_steps)
      .def_property_readonly("skipped_steps", &EngineCore::skipped_steps)
      .def_property_readonly("micro_steps", &EngineCore::micro_steps)
      .def_property_readonly(
          "optimizer",
          [](EngineCore& core) -> optim::ChunkedOptimizer& { return core.optimizer(); },
          py::return_value_policy::reference_internal);
}

}  // namespace spillway::python
