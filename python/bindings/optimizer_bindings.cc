// The chunked optimizers for Python (spillway.optim wraps them in
// torch.optim.Optimizer subclasses). Options cross as dicts with torch's
// names; the Python side has already rejected options spillway does not
// support, so a missing or mistyped key here is a bug, reported by pybind11.
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "hooks/torch/optim.h"
#include "python/bindings/bindings.h"

namespace spillway::python {

namespace {

using optim::ChunkedOptimizer;
using torch::optim::AdamOptions;
using torch::optim::AdamWOptions;
using torch::optim::OptimizerOptions;
using torch::optim::SGDOptions;

template <typename Options>
void set_adam_family(Options& options, const py::dict& values) {
  options.lr(values["lr"].cast<double>());
  const auto betas = values["betas"].cast<std::pair<double, double>>();
  options.betas({betas.first, betas.second});
  options.eps(values["eps"].cast<double>());
  options.weight_decay(values["weight_decay"].cast<double>());
}

void set_sgd(SGDOptions& options, const py::dict& values) {
  options.lr(values["lr"].cast<double>());
  options.momentum(values["momentum"].cast<double>());
  options.dampening(values["dampening"].cast<double>());
  options.weight_decay(values["weight_decay"].cast<double>());
  options.nesterov(values["nesterov"].cast<bool>());
}

// Writes a group's Python options into the C++ options of the same kind.
void set_options(OptimizerOptions& options, const py::dict& values) {
  if (auto* adamw = dynamic_cast<AdamWOptions*>(&options)) return set_adam_family(*adamw, values);
  if (auto* adam = dynamic_cast<AdamOptions*>(&options)) return set_adam_family(*adam, values);
  if (auto* sgd = dynamic_cast<SGDOptions*>(&options)) return set_sgd(*sgd, values);
  throw std::logic_error("spillway optim: options of an unknown optimizer");
}

std::unique_ptr<OptimizerOptions> make_options(const std::string& kind, const py::dict& values) {
  std::unique_ptr<OptimizerOptions> options;
  if (kind == "Adam") {
    options = std::make_unique<AdamOptions>();
  } else if (kind == "AdamW") {
    options = std::make_unique<AdamWOptions>();
  } else if (kind == "SGD") {
    options = std::make_unique<SGDOptions>(values["lr"].cast<double>());
  } else {
    throw std::invalid_argument("spillway optim: unknown optimizer '" + kind +
                                "' (Adam, AdamW or SGD)");
  }
  set_options(*options, values);
  return options;
}

using Group = std::pair<std::vector<at::Tensor>, py::dict>;

std::unique_ptr<ChunkedOptimizer> make_optimizer(const std::string& kind,
                                                 const std::vector<Group>& groups) {
  if (groups.empty()) throw std::invalid_argument("spillway optim: no parameter groups");
  std::vector<torch::optim::OptimizerParamGroup> param_groups;
  for (const auto& [params, values] : groups)
    param_groups.emplace_back(params, make_options(kind, values));
  // Torch's constructors take defaults too; the first group's options serve.
  const std::unique_ptr<OptimizerOptions> defaults = make_options(kind, groups.front().second);
  py::gil_scoped_release release;  // placing the state copies into chunks
  // Python's torch.optim rounds Adam's first moment through lerp_.
  if (kind == "Adam") {
    auto adam = std::make_unique<optim::Adam>(std::move(param_groups),
                                              static_cast<const AdamOptions&>(*defaults));
    adam->set_first_moment_by_lerp(true);
    return adam;
  }
  if (kind == "AdamW") {
    auto adamw = std::make_unique<optim::AdamW>(std::move(param_groups),
                                                static_cast<const AdamWOptions&>(*defaults));
    adamw->set_first_moment_by_lerp(true);
    return adamw;
  }
  return std::make_unique<optim::SGD>(std::move(param_groups),
                                      static_cast<const SGDOptions&>(*defaults));
}

py::object param_state(const ChunkedOptimizer& optimizer, const at::Tensor& param) {
  std::optional<ChunkedOptimizer::ParamState> state;
  {
    py::gil_scoped_release release;
    state = optimizer.param_state(param);
  }
  if (!state) return py::none();
  py::object master = state->master.defined() ? py::cast(state->master) : py::none();
  return py::make_tuple(state->step, state->started, state->slots, master);
}

void set_param_state(ChunkedOptimizer& optimizer, const at::Tensor& param, std::int64_t step,
                     bool started, std::vector<at::Tensor> slots,
                     std::optional<at::Tensor> master) {
  ChunkedOptimizer::ParamState state;
  state.step = step;
  state.started = started;
  state.slots = std::move(slots);
  if (master) state.master = std::move(*master);
  py::gil_scoped_release release;
  optimizer.set_param_state(param, state);
}

}  // namespace

void bind_optimizers(py::module_& module) {
  py::class_<ChunkedOptimizer>(module, "ChunkedOptimizer")
      .def(
          "step",
          [](ChunkedOptimizer& optimizer, double grad_scale) { optimizer.step_scaled(grad_scale); },
          py::arg("grad_scale") = 1.0, py::call_guard<py::gil_scoped_release>())
      .def("set_group_options",
           [](ChunkedOptimizer& optimizer, std::size_t index, const py::dict& values) {
             if (index >= optimizer.param_groups().size())
               throw py::index_error("spillway optim: no parameter group " + std::to_string(index));
             set_options(optimizer.param_groups()[index].options(), values);
           })
      .def("add_param_group",
           [](ChunkedOptimizer& optimizer, const std::string& kind, std::vector<at::Tensor> params,
              const py::dict& values) {
             optimizer.add_param_group(
                 torch::optim::OptimizerParamGroup(std::move(params), make_options(kind, values)));
           })
      .def("param_state", &param_state, py::arg("param"))
      .def("set_param_state", &set_param_state, py::arg("param"), py::arg("step"),
           py::arg("started"), py::arg("slots"), py::arg("master"))
      .def(
          "gradient_summary",
          [](ChunkedOptimizer& optimizer, double grad_scale) {
            const optim::GradientSummary summary = optimizer.gradient_summary(grad_scale);
            return std::make_pair(summary.global_norm, summary.found_inf);
          },
          py::arg("grad_scale") = 1.0, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("client_name", &ChunkedOptimizer::client_name)
      .def_property_readonly("placement", [](const ChunkedOptimizer& optimizer) {
        const optim::UpdatePlacement placement = optimizer.placement();
        return std::make_pair(placement.host, placement.device);
      });
  module.def("make_optimizer", &make_optimizer, py::arg("kind"), py::arg("groups"));
}

}  // namespace spillway::python
