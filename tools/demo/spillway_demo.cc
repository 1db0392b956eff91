// spillway-demo: the whole stack below the LibTorch bridge, end to end.
//
// Activates spillway from SPILLWAY_CONF (the simulated GPU where no GPU is
// usable), registers the "parameters" of a layered model whose model data is
// several times the device budget with the process-wide chunk manager, and
// runs training-like steps: forward through the layers (acquire a layer's
// parameters, allocate its activation), backward in reverse (acquire again,
// update the parameters in place, free the activation). Activations and chunks
// share the one budget, so chunks spill to host memory and come back every
// step. At the end every parameter is checked against a host-side copy that
// received the same updates, and the spill statistics are printed.
// tools/demo.sh runs spillway-train-demo (tools/train_demo/) instead where
// Torch is found.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "allocator/runtime.h"

namespace spillway {
namespace {

struct DemoOptions {
  int layers = 24;
  int steps = 3;
  std::size_t layer_param_bytes = std::size_t{16} << 20;
  std::size_t activation_bytes = std::size_t{2} << 20;
};

struct Layer {
  TensorId params;
  std::vector<std::uint32_t> expected;  // what the parameters must hold
};

// `detail` is called after the call that gave `status` has returned: an
// argument such as ChunkManager::last_error() evaluated beside that call may
// run first (C++ leaves the order open) and read an empty message.
using ErrorDetail = std::string (*)();
std::string no_detail() { return "no detail"; }

bool check(Status status, const char* what, ErrorDetail detail) {
  if (status == Status::ok) return true;
  fmt::print(stderr, "spillway-demo: {} failed: {} ({})\n", what, to_string(status), detail());
  return false;
}

// The "kernel" of a backward step: every parameter word += step + layer,
// applied to the chunk's device bytes through a host staging copy, and to the
// expected copy on the host.
bool update_layer(Runtime& runtime, Layer& layer, int step, int index, std::size_t bytes) {
  ChunkManager& chunks = runtime.chunk_manager();
  Device& device = runtime.device();
  void* data = nullptr;
  if (!check(chunks.acquire(layer.params, Stream{}, &data, AccessMode::read_write, WaitMode::host),
             "acquire", ChunkManager::last_error)) {
    return false;
  }
  std::vector<std::uint32_t> staging(bytes / 4);
  bool ok = check(device.copy_async(staging.data(), data, bytes, Stream{}), "copy", no_detail) &&
            check(device.synchronize_stream(Stream{}), "synchronize", no_detail);
  for (std::size_t i = 0; i < staging.size(); ++i) {
    staging[i] += static_cast<std::uint32_t>(step + index);
    layer.expected[i] += static_cast<std::uint32_t>(step + index);
  }
  ok = ok && check(device.copy_async(data, staging.data(), bytes, Stream{}), "copy", no_detail) &&
       check(device.synchronize_stream(Stream{}), "synchronize", no_detail);
  return check(chunks.release(layer.params, Stream{}), "release", ChunkManager::last_error) && ok;
}

int run_demo(const DemoOptions& demo) {
  Runtime& runtime = Runtime::process();
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  if (allocator == nullptr) {
    fmt::print(stderr, "spillway-demo: {}\n", error);
    return 2;
  }
  ChunkManager& chunks = runtime.chunk_manager();
  const std::size_t budget = allocator->budget_bytes();
  const std::size_t model_bytes = demo.layers * demo.layer_param_bytes;
  fmt::print("device: {}\n", runtime.device().name());
  fmt::print(
      "device budget {:.1f} MiB, model data {:.1f} MiB ({:.1f}x the budget), chunk {:.1f} MiB\n",
      budget / 1048576.0, model_bytes / 1048576.0, double(model_bytes) / budget,
      runtime.config().chunk_size / 1048576.0);

  const ClientId model = chunks.add_client("demo-model");
  std::vector<Layer> layers(demo.layers);
  std::mt19937 rng(1);
  for (int i = 0; i < demo.layers; ++i) {
    TensorSpec spec{TensorKind::param, 0, 4, demo.layer_param_bytes / 4, fmt::format("layer{}", i)};
    if (!check(chunks.register_tensor(model, spec, &layers[i].params), "register_tensor",
               ChunkManager::last_error)) {
      return 1;
    }
    layers[i].expected.resize(demo.layer_param_bytes / 4);
    for (auto& word : layers[i].expected) word = rng();
    void* data = nullptr;
    if (!check(chunks.acquire(layers[i].params, Stream{}, &data, AccessMode::read_write,
                              WaitMode::host),
               "acquire", ChunkManager::last_error) ||
        !check(runtime.device().copy_async(data, layers[i].expected.data(), demo.layer_param_bytes,
                                           Stream{}),
               "copy", no_detail) ||
        !check(runtime.device().synchronize_stream(Stream{}), "synchronize", no_detail) ||
        !check(chunks.release(layers[i].params, Stream{}), "release", ChunkManager::last_error)) {
      return 1;
    }
  }

  for (int step = 0; step < demo.steps; ++step) {
    const std::uint64_t start = runtime.device().now_ns();
    const Stats before = runtime.stats();
    std::vector<void*> activations(demo.layers, nullptr);
    for (int i = 0; i < demo.layers; ++i) {  // forward
      void* data = nullptr;
      if (!check(
              chunks.acquire(layers[i].params, Stream{}, &data, AccessMode::read, WaitMode::host),
              "acquire", ChunkManager::last_error) ||
          !check(allocator->allocate(&activations[i], demo.activation_bytes, Stream{}),
                 "activation allocate", CachingAllocator::last_error) ||
          !check(chunks.release(layers[i].params, Stream{}), "release", ChunkManager::last_error)) {
        return 1;
      }
    }
    for (int i = demo.layers - 1; i >= 0; --i) {  // backward
      if (!update_layer(runtime, layers[i], step, i, demo.layer_param_bytes) ||
          !check(allocator->deallocate(activations[i]), "activation free",
                 CachingAllocator::last_error)) {
        return 1;
      }
    }
    const Stats after = runtime.stats();
    fmt::print("step {}: {:.3f} s, {} evictions, {:.1f} MiB to host, {:.1f} MiB to device\n", step,
               (runtime.device().now_ns() - start) / 1e9, after.evictions - before.evictions,
               (after.bytes_moved_d2h - before.bytes_moved_d2h) / 1048576.0,
               (after.bytes_moved_h2d - before.bytes_moved_h2d) / 1048576.0);
  }

  int mismatched = 0;
  for (int i = 0; i < demo.layers; ++i) {
    void* host = nullptr;
    if (!check(chunks.acquire_host(layers[i].params, &host, AccessMode::read), "acquire_host",
               ChunkManager::last_error)) {
      return 1;
    }
    mismatched += std::memcmp(host, layers[i].expected.data(), demo.layer_param_bytes) != 0;
    chunks.release_host(layers[i].params);
  }
  const Stats stats = runtime.stats();
  fmt::print("parameters bit-identical to the host reference: {}\n",
             mismatched == 0 ? "yes" : fmt::format("NO ({} layers differ)", mismatched));
  fmt::print(
      "totals: peak reserved {:.1f} MiB of {:.1f} MiB budget, {} evictions, {:.1f} MiB moved to "
      "host, {:.1f} MiB to device, {:.3f} s stalled on fetches\n",
      stats.reserved_bytes.peak / 1048576.0, budget / 1048576.0, stats.evictions,
      stats.bytes_moved_d2h / 1048576.0, stats.bytes_moved_h2d / 1048576.0, stats.stall_ns / 1e9);
  fmt::print("stats: {}\n", stats.to_json());
  chunks.remove_client(model);
  return mismatched == 0 ? 0 : 1;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  CLI::App app{
      "spillway-demo: trains a layered stand-in model bigger than the device budget "
      "(configured by SPILLWAY_CONF)"};
  spillway::DemoOptions demo;
  int layer_mib = 16, activation_mib = 2;
  app.add_option("--layers", demo.layers, "layers of the model")->check(CLI::Range(1, 4096));
  app.add_option("--layer-mib", layer_mib, "parameter MiB per layer")->check(CLI::Range(1, 4096));
  app.add_option("--activation-mib", activation_mib, "activation MiB per layer")
      ->check(CLI::Range(1, 4096));
  app.add_option("--steps", demo.steps, "training steps")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  demo.layer_param_bytes = static_cast<std::size_t>(layer_mib) << 20;
  demo.activation_bytes = static_cast<std::size_t>(activation_mib) << 20;
  return spillway::run_demo(demo);
}
