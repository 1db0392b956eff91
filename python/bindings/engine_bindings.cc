// The engine behind spillway.initialize: the Python package parses nothing
// itself; the DeepSpeed-style configuration is checked here (errors name the
// key), the package casts the model to the compute dtype, and EngineCore
// takes the named parameters.
#include <cstdint>
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
      "engine_config_summary",
      [](const std::string& json) {
        const engine::EngineConfig config = engine::parse_engine_config(json);
        py::dict out;
        out["compute_dtype"] = dtype_name(config.precision);
        out["gradient_accumulation_steps"] = config.gradient_accumulation_steps;
        out["train_batch_size"] = config.train_batch_size;
        out["train_micro_batch_size_per_gpu"] = config.train_micro_batch_size_per_gpu;
        out["zero_stage"] = config.zero.stage;
        out["has_scheduler"] = config.scheduler.has_value();
        out["spillway_conf"] = config.spillway_conf;
        const engine::OptimizerConfig& o = config.optimizer;
        py::dict options;
        options["lr"] = o.lr;
        options["weight_decay"] = o.weight_decay;
        if (o.type == engine::OptimizerType::sgd) {
          options["momentum"] = o.momentum;
          options["dampening"] = o.dampening;
          options["nesterov"] = o.nesterov;
        } else {
          options["betas"] = py::make_tuple(o.beta1, o.beta2);
          options["eps"] = o.eps;
        }
        out["optimizer"] = py::make_tuple(engine::to_string(o.type), options);
        return out;
      },
      py::arg("config_json"),
      "What the Python package builds from a configuration: the compute dtype, the batch "
      "sizes, the ZeRO stage, and the optimizer's kind and torch-style options. ValueError "
      "naming a bad key.");
  py::class_<EngineCore>(module, "EngineCore")
      .def(py::init(
               [](std::vector<std::pair<std::string, at::Tensor>> named, const std::string& json) {
                 engine::EngineConfig config = engine::parse_engine_config(json);
                 py::gil_scoped_release release;
                 return std::make_unique<EngineCore>(std::move(named), std::move(config));
               }),
           py::arg("named_params"), py::arg("config_json"))
      .def(py::init([](std::vector<std::pair<std::string, at::Tensor>> named,
                       const std::string& json, optim::ChunkedOptimizer& optimizer) {
             engine::EngineConfig config = engine::parse_engine_config(json);
             py::gil_scoped_release release;
             return std::make_unique<EngineCore>(std::move(named), std::move(config), optimizer);
           }),
           py::arg("named_params"), py::arg("config_json"), py::arg("optimizer"),
           py::keep_alive<1, 4>())
      .def("backward", &EngineCore::backward, py::arg("loss"),
           py::call_guard<py::gil_scoped_release>())
      .def("step", &EngineCore::step, py::call_guard<py::gil_scoped_release>())
      .def("is_gradient_accumulation_boundary", &EngineCore::is_gradient_accumulation_boundary)
      .def_property_readonly("loss_scale", &EngineCore::loss_scale)
      .def_property_readonly("last_gradient_norm", &EngineCore::last_gradient_norm)
      .def_property_readonly("global_steps", &EngineCore::global_steps)
      .def_property_readonly("skipped_steps", &EngineCore::skipped_steps)
      .def_property_readonly("micro_steps", &EngineCore::micro_steps)
      .def_property_readonly("global_samples", &EngineCore::global_samples)
      .def("was_step_applied", &EngineCore::was_step_applied)
      .def("zero_grad", &EngineCore::zero_grad, py::call_guard<py::gil_scoped_release>())
      .def("get_lr", &EngineCore::get_lr)
      .def("group_momentum", &EngineCore::group_momentum)
      .def("add_forward_time", &EngineCore::add_forward_time, py::arg("milliseconds"))
      .def_property_readonly("has_lr_schedule", &EngineCore::has_lr_schedule)
      .def_property_readonly("lr_schedule_iteration", &EngineCore::lr_schedule_iteration)
      .def("step_lr_schedule", &EngineCore::step_lr_schedule)
      .def("restore_lr_schedule", &EngineCore::restore_lr_schedule, py::arg("last_batch_iteration"))
      .def("state_dict",
           [](const EngineCore& core) {
             const EngineCore::State state = core.state();
             py::dict scaler;
             scaler["scale"] = state.loss_scaler.scale;
             scaler["hysteresis_left"] = state.loss_scaler.hysteresis_left;
             scaler["iteration"] = state.loss_scaler.iteration;
             scaler["last_overflow_iteration"] = state.loss_scaler.last_overflow_iteration;
             scaler["overflows"] = state.loss_scaler.overflows;
             py::dict out;
             out["micro_steps"] = state.micro_steps;
             out["global_steps"] = state.global_steps;
             out["global_samples"] = state.global_samples;
             out["skipped_steps"] = state.skipped_steps;
             out["last_gradient_norm"] = state.last_gradient_norm;
             out["loss_scaler"] = scaler;
             return out;
           })
      .def(
          "load_state_dict",
          [](EngineCore& core, const py::dict& saved) {
            EngineCore::State state;
            const py::dict scaler = saved["loss_scaler"].cast<py::dict>();
            state.loss_scaler.scale = scaler["scale"].cast<double>();
            state.loss_scaler.hysteresis_left = scaler["hysteresis_left"].cast<int>();
            state.loss_scaler.iteration = scaler["iteration"].cast<std::int64_t>();
            state.loss_scaler.last_overflow_iteration =
                scaler["last_overflow_iteration"].cast<std::int64_t>();
            state.loss_scaler.overflows = scaler["overflows"].cast<std::uint64_t>();
            state.micro_steps = saved["micro_steps"].cast<std::uint64_t>();
            state.global_steps = saved["global_steps"].cast<std::uint64_t>();
            state.global_samples = saved["global_samples"].cast<std::uint64_t>();
            state.skipped_steps = saved["skipped_steps"].cast<std::uint64_t>();
            state.last_gradient_norm = saved["last_gradient_norm"].cast<double>();
            core.set_state(state);
          },
          py::arg("state"))
      .def_property_readonly(
          "optimizer",
          [](EngineCore& core) -> optim::ChunkedOptimizer& { return core.optimizer(); },
          py::return_value_policy::reference_internal);
}

}  // namespace spillway::python
