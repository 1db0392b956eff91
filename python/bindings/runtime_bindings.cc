// The runtime API for Python: configuration, activation, manage / unmanage,
// statistics, traces and the step boundary. Errors cross as Python
// exceptions: std::invalid_argument as ValueError, std::runtime_error as
// RuntimeError, c10::OutOfMemoryError (an allocation on the sim device that
// did not fit, say in unmanage) as torch.OutOfMemoryError, with spillway's
// message.
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "allocator/config/config.h"
#include "allocator/runtime.h"
#include "hooks/torch/data_parallel.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"
#include "python/bindings/bindings.h"

namespace spillway::python {

namespace {

// The device a configuration text asks for ("auto", "cuda" or "sim"); throws
// std::invalid_argument with the parser's message, which names the key.
std::string checked_device(const std::string& conf) {
  const ConfigResult parsed = parse_config(conf);
  if (!parsed.ok()) throw std::invalid_argument(parsed.error->message);
  return std::string(to_string(parsed.config->device));
}

// A context manager that holds a `Scope` (an RAII guard) for its block.
template <typename Scope>
class ScopeContext {
 public:
  void enter() { scope_.emplace(); }
  void exit() { scope_.reset(); }

 private:
  std::optional<Scope> scope_;
};

template <typename Scope>
void bind_scope(py::module_& module, const char* name) {
  using Context = ScopeContext<Scope>;
  py::class_<Context>(module, name)
      .def(py::init<>())
      .def("__enter__", [](Context& context) { context.enter(); })
      .def("__exit__", [](Context& context, const py::args&) { context.exit(); });
}

}  // namespace

void bind_runtime(py::module_& module) {
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const c10::OutOfMemoryError& error) {
      const py::object type = py::module_::import("torch").attr("OutOfMemoryError");
      PyErr_SetString(type.ptr(), error.what_without_backtrace());
    }
  });
  // The caching allocator's budget from now on, in bytes (tests size it to
  // what a model needs outside chunks, as torch's
  // set_per_process_memory_fraction would).
  module.def(
      "_set_device_budget",
      [](std::size_t bytes) {
        CachingAllocator* allocator = Runtime::process().active_allocator();
        if (allocator == nullptr) throw std::runtime_error("spillway is not active");
        allocator->set_budget_bytes(bytes);
      },
      py::arg("bytes"));
  // `with spillway._C._HostWork():` torch's allocations on this thread go
  // to torch's own allocator, off the simulated device (HostWorkScope): for
  // the tests' plain-torch reference runs in a process where spillway is
  // active.
  bind_scope<torch_bridge::HostWorkScope>(module, "_HostWork");
  // `with spillway._C._OwnerUses():` ops use the parameters this rank owns
  // in place and gather nothing (Note [Uses only the owner makes] in
  // hooks/torch/sharded_params.cc): a checkpoint's save.
  bind_scope<torch_bridge::OwnerUses>(module, "_OwnerUses");
  module.def("configure", &spillway::configure, py::arg("conf"),
             "Sets the configuration (SPILLWAY_CONF syntax) for activation.");
  module.def("activate", &spillway::activate, py::call_guard<py::gil_scoped_release>(),
             "Activates spillway now and installs the op hooks.");
  module.def(
      "is_active", [] { return Runtime::process().active_allocator() != nullptr; },
      "Whether spillway's runtime is active in this process.");
  module.def("checked_device", &checked_device, py::arg("conf"),
             "The device a configuration asks for; ValueError naming the key when it is bad.");
  module.def(
      "checked_option",
      [](const std::string& conf, const std::string& key) {
        const ConfigResult parsed = parse_config(conf);
        if (!parsed.ok()) throw std::invalid_argument(parsed.error->message);
        return format_option_value(*parsed.config, key);
      },
      py::arg("conf"), py::arg("key"),
      "One option's value as a configuration sets it (SPILLWAY_CONF syntax; its default when "
      "the text leaves it out); ValueError naming the key when the text is bad.");
  module.def(
      "manage",
      [](std::vector<std::pair<std::string, at::Tensor>> named, const std::string& client) {
        py::gil_scoped_release release;
        spillway::manage(std::move(named), client);
      },
      py::arg("named_params"), py::arg("client") = "torch");
  module.def(
      "unmanage",
      [](std::vector<at::Tensor> params) {
        py::gil_scoped_release release;
        spillway::unmanage(std::move(params));
      },
      py::arg("params"));
  module.def(
      "_reset_peak_stats",
      [] {
        if (CachingAllocator* allocator = Runtime::process().active_allocator())
          allocator->reset_peak_stats();
      },
      "Every peak figure of memory_stats() starts again from its current value.");
  module.def("_is_managed", &spillway::is_managed, py::arg("tensor"),
             "Whether the tensor's storage lives in a chunk.");
  module.def("use_as_torch_cuda_allocator", &spillway::use_as_torch_cuda_allocator,
             py::call_guard<py::gil_scoped_release>(),
             "Makes spillway torch's CUDA allocator (hooks/torch/torch_cuda_allocator.h).");
  // Whether use_as_torch_cuda_allocator can work in this build: built against
  // a CUDA torch of the toolkit's CUDA major (SPILLWAY_TORCH_CUDA_USABLE).
#ifdef SPILLWAY_HAVE_TORCH_CUDA
  module.attr("has_torch_cuda_allocator") = true;
#else
  module.attr("has_torch_cuda_allocator") = false;
#endif
  module.def("memory_stats_json", &spillway::memory_stats_json);
  module.def("dump_trace", &spillway::dump_trace, py::arg("path"),
             py::call_guard<py::gil_scoped_release>());
  module.def("step", &spillway::step, py::call_guard<py::gil_scoped_release>());
  // Note [Data parallel over chunk groups] (hooks/torch/data_parallel.cc):
  // torch.distributed's ProcessGroup, as torch's own bindings hold it.
  module.def(
      "set_process_group",
      [](const py::object& group) {
        c10::intrusive_ptr<c10d::ProcessGroup> held;
        if (!group.is_none()) held = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
        py::gil_scoped_release release;
        spillway::set_process_group(std::move(held));
      },
      py::arg("group"));
  module.def("reduce_gradients",
             py::overload_cast<const std::vector<torch::Tensor>&>(&spillway::reduce_gradients),
             py::arg("params"), py::call_guard<py::gil_scoped_release>());
  // spillway.no_sync()'s context (Note [Reducing while backward runs]).
  struct NoSyncContext {
    std::optional<spillway::NoSync> scope;
  };
  py::class_<NoSyncContext>(module, "_NoSync")
      .def(py::init<>())
      .def("__enter__", [](NoSyncContext& context) { context.scope.emplace(); })
      .def("__exit__", [](NoSyncContext& context, const py::args&) {
        context.scope.reset();
        return false;
      });
  module.def("data_parallel_world_size", &spillway::data_parallel_world_size);
  module.def("data_parallel_rank", &spillway::data_parallel_rank);
  // What the GPU check asks of a group dist:env made.
  module.def("_data_parallel_backend", &spillway::torch_bridge::data_parallel_backend_name);
  module.def("data_parallel_owners", &spillway::data_parallel_owners, py::arg("tensors"),
             py::call_guard<py::gil_scoped_release>());
  module.def("barrier", &spillway::torch_bridge::barrier, py::arg("what"),
             py::call_guard<py::gil_scoped_release>());
  module.def("data_parallel_traffic", [] {
    const spillway::DataParallelTraffic traffic = spillway::data_parallel_traffic();
    py::dict figures;
    figures["bytes_sent"] = traffic.bytes_sent;
    figures["bytes_received"] = traffic.bytes_received;
    figures["collectives"] = traffic.collectives;
    figures["parameter_gathers"] = traffic.parameter_gathers;
    figures["parameter_gathers_ahead"] = traffic.parameter_gathers_ahead;
    return figures;
  });
  // Note [Per-parameter figures summed over owners]: for the clipping and
  // the loss scaler's overflow check of spillway/_data_parallel.py.
  module.def("owned_figures_everywhere", &spillway::torch_bridge::owned_figures_everywhere,
             py::arg("figures"), py::arg("what"), py::call_guard<py::gil_scoped_release>());
  // Note [Uses only the owner makes]: a step a loss scaler skips.
  module.def("_close_owner_step", &spillway::torch_bridge::close_owner_step);
  module.def("on_any_rank", &spillway::torch_bridge::on_any_rank, py::arg("condition"),
             py::arg("what"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace spillway::python
