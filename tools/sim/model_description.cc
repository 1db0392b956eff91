// Model descriptions: JSON parsing, the GPT generator, and the chunk layout.
// Layers of one kind are packed back to back, so a layer may share a chunk
// with its neighbours, as tensors registered in order share chunks in the
// chunk manager.
#include "tools/sim/model_description.h"

#include <cmath>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace spillway::sim {
namespace {

using nlohmann::json;

// Note [Numbers a description may hold]
// Bytes and nanoseconds up to 2^50 (a petabyte, 13 days), counts of layers
// up to kMaxLayers: far beyond any model, yet small enough that sums of them
// do not wrap and a simulation of them fits in memory. A larger number is
// an error naming its field, where it once wrapped to garbage figures or ran
// until memory ran out.
constexpr std::uint64_t kMaxNumber = std::uint64_t{1} << 50;
constexpr std::uint64_t kMaxLayers = 100'000;

std::uint64_t field(const json& object, const char* key, const std::string& where,
                    std::uint64_t fallback, bool required) {
  auto found = object.find(key);
  if (found == object.end()) {
    if (required) throw ModelError(where + ": missing \"" + key + "\"");
    return fallback;
  }
  const bool number =
      found->is_number_unsigned() || (found->is_number_float() && found->get<double>() >= 0 &&
                                      found->get<double>() <= static_cast<double>(kMaxNumber));
  if (!number) throw ModelError(where + ": \"" + key + "\" must be a non-negative number");
  const std::uint64_t value = found->is_number_unsigned()
                                  ? found->get<std::uint64_t>()
                                  : static_cast<std::uint64_t>(found->get<double>());
  if (value > kMaxNumber)
    throw ModelError(where + ": \"" + key + "\" is " + std::to_string(value) + ", more than 2^50");
  return value;
}

// A positive, finite rate (flops or bytes per second).
double rate_field(const json& object, const char* key, const std::string& where) {
  const json& value = object.at(key);
  if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>()))
    throw ModelError(where + ": \"" + key + "\" must be a positive number");
  return value.get<double>();
}

// A string field, or `fallback` when absent.
std::string name_field(const json& object, const char* key, const std::string& where,
                       const std::string& fallback) {
  auto found = object.find(key);
  if (found == object.end()) return fallback;
  if (!found->is_string()) throw ModelError(where + ": \"" + key + "\" must be a string");
  return found->get<std::string>();
}

// Chunks [first, last] holding `bytes` at `offset` of a kind's run.
struct ChunkRange {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
};

ChunkRange place(std::uint64_t& offset, std::uint64_t bytes, std::uint64_t chunk_size) {
  if (bytes == 0) return {};
  const ChunkRange range{offset / chunk_size,
                         (offset + bytes - 1) / chunk_size - offset / chunk_size + 1};
  offset += bytes;
  return range;
}

std::vector<plan::PlanChunk> chunk_ids(std::uint64_t base, ChunkRange range) {
  std::vector<plan::PlanChunk> ids;
  for (std::uint64_t c = 0; c < range.count; ++c)
    ids.push_back(static_cast<plan::PlanChunk>(base + range.first + c));
  return ids;
}

void use(plan::TracedOp& op, const std::vector<plan::PlanChunk>& chunks, bool write) {
  for (const plan::PlanChunk chunk : chunks) op.chunks.push_back({chunk, write});
}

std::uint64_t chunks_of(std::uint64_t bytes, std::uint64_t chunk_size) {
  return (bytes + chunk_size - 1) / chunk_size;
}

}  // namespace

std::uint64_t ModelSpec::model_bytes() const {
  std::uint64_t bytes = 0;
  for (const LayerSpec& layer : layers) {
    bytes += layer.param_bytes + layer.grad_bytes + layer.optimizer_bytes;
  }
  return bytes;
}

ModelSpec gpt_model(const GptSpec& spec) {
  if (spec.n_layers == 0 || spec.d_model == 0 || spec.seq == 0 || spec.batch == 0) {
    throw ModelError("gpt: n_layers, d_model, seq and batch must be positive");
  }
  // Note [Numbers a description may hold]
  if (spec.n_layers > kMaxLayers || spec.d_model > (1u << 20) || spec.seq > (1u << 24) ||
      spec.batch > (1u << 24) || spec.dtype_bytes == 0 || spec.dtype_bytes > 16)
    throw ModelError("gpt: n_layers at most " + std::to_string(kMaxLayers) +
                     ", d_model at most 2^20, seq and batch at most 2^24, dtype_bytes 1 to 16");
  ModelSpec model;
  model.gpt = spec;
  model.name = "gpt-l" + std::to_string(spec.n_layers) + "-d" + std::to_string(spec.d_model);
  const double d = static_cast<double>(spec.d_model);
  const double s = static_cast<double>(spec.seq);
  const double b = static_cast<double>(spec.batch);
  const double heads = std::max(1.0, d / 64);
  const double params = 12 * d * d;
  const double tokens = s * b;
  const double forward_flops = 2 * params * tokens + 4 * b * s * s * d;
  const double activation = s * b * d * (34 + 5 * heads * s / d) * spec.dtype_bytes / 2;
  for (std::uint64_t l = 0; l < spec.n_layers; ++l) {
    LayerSpec layer;
    layer.name = "block" + std::to_string(l);
    layer.param_bytes = static_cast<std::uint64_t>(params) * spec.dtype_bytes;
    layer.grad_bytes = layer.param_bytes;
    layer.optimizer_bytes = static_cast<std::uint64_t>(params) * 12;
    layer.activation_bytes = static_cast<std::uint64_t>(activation);
    layer.forward_ns = static_cast<std::uint64_t>(forward_flops / spec.flops_per_s * 1e9);
    layer.backward_ns = 2 * layer.forward_ns;
    const double touched = 2.0 * (layer.param_bytes + layer.grad_bytes + layer.optimizer_bytes);
    layer.optimizer_ns = static_cast<std::uint64_t>(touched / spec.optimizer_bytes_per_s * 1e9);
    model.layers.push_back(layer);
  }
  return model;
}

ModelSpec parse_model(const std::string& json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& error) {
    throw ModelError(std::string("not JSON: ") + error.what());
  }
  if (!root.is_object()) throw ModelError("the description must be a JSON object");
  if (auto gpt = root.find("gpt"); gpt != root.end()) {
    GptSpec spec;
    spec.n_layers = field(*gpt, "n_layers", "gpt", 0, true);
    spec.d_model = field(*gpt, "d_model", "gpt", 0, true);
    spec.seq = field(*gpt, "seq", "gpt", 0, true);
    spec.batch = field(*gpt, "batch", "gpt", 0, true);
    spec.dtype_bytes = field(*gpt, "dtype_bytes", "gpt", 2, false);
    if (gpt->contains("flops_per_s")) spec.flops_per_s = rate_field(*gpt, "flops_per_s", "gpt");
    if (gpt->contains("optimizer_bytes_per_s"))
      spec.optimizer_bytes_per_s = rate_field(*gpt, "optimizer_bytes_per_s", "gpt");
    ModelSpec model = gpt_model(spec);
    model.name = name_field(root, "name", "description", model.name);
    return model;
  }
  auto layers = root.find("layers");
  if (layers == root.end() || !layers->is_array() || layers->empty()) {
    throw ModelError("the description needs a non-empty \"layers\" array or a \"gpt\" object");
  }
  ModelSpec model;
  model.name = name_field(root, "name", "description", "model");
  const std::uint64_t repeat = field(root, "repeat", "description", 1, false);
  if (repeat * layers->size() > kMaxLayers)  // each at most 2^50: no wrap
    throw ModelError("description: " + std::to_string(repeat) + " repeats of " +
                     std::to_string(layers->size()) + " layers are more than " +
                     std::to_string(kMaxLayers) + " layers");
  for (std::uint64_t r = 0; r < repeat; ++r) {
    for (std::size_t i = 0; i < layers->size(); ++i) {
      const json& entry = (*layers)[i];
      const std::string where = "layers[" + std::to_string(i) + "]";
      if (!entry.is_object()) throw ModelError(where + ": must be an object");
      LayerSpec layer;
      layer.name = name_field(entry, "name", where, "layer" + std::to_string(i));
      if (repeat > 1) layer.name += "." + std::to_string(r);
      layer.param_bytes = field(entry, "param_bytes", where, 0, true);
      layer.grad_bytes = field(entry, "grad_bytes", where, layer.param_bytes, false);
      layer.optimizer_bytes = field(entry, "optimizer_bytes", where, 0, false);
      layer.activation_bytes = field(entry, "activation_bytes", where, 0, false);
      layer.forward_ns = field(entry, "forward_ns", where, 0, true);
      layer.backward_ns = field(entry, "backward_ns", where, 2 * layer.forward_ns, false);
      layer.optimizer_ns = field(entry, "optimizer_ns", where, 0, false);
      model.layers.push_back(layer);
    }
  }
  return model;
}

ModelSpec load_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ModelError(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parse_model(text.str());
  } catch (const ModelError& error) {
    throw ModelError(path + ": " + error.what());
  }
}

plan::StepTrace step_trace(const ModelSpec& model, std::uint64_t chunk_size) {
  if (chunk_size == 0) throw ModelError("chunk size must be positive");
  std::uint64_t param_total = 0, grad_total = 0, optimizer_total = 0;
  for (const LayerSpec& layer : model.layers) {
    param_total += layer.param_bytes;
    grad_total += layer.grad_bytes;
    optimizer_total += layer.optimizer_bytes;
  }
  // Each chunk is an id the simulation tracks: a bound on their number.
  constexpr std::uint64_t kMaxChunks = 10'000'000;
  const std::uint64_t chunks_needed = chunks_of(param_total, chunk_size) +
                                      chunks_of(grad_total, chunk_size) +
                                      chunks_of(optimizer_total, chunk_size);
  if (chunks_needed > kMaxChunks)
    throw ModelError("the model takes " + std::to_string(chunks_needed) + " chunks of " +
                     std::to_string(chunk_size) + " bytes, more than the " +
                     std::to_string(kMaxChunks) + " a simulation holds: a larger chunk size");
  const std::uint64_t grad_base = chunks_of(param_total, chunk_size);
  const std::uint64_t optimizer_base = grad_base + chunks_of(grad_total, chunk_size);

  std::vector<LayerChunks> chunks;
  std::uint64_t param_offset = 0, grad_offset = 0, optimizer_offset = 0;
  for (const LayerSpec& layer : model.layers) {
    chunks.push_back(
        {chunk_ids(0, place(param_offset, layer.param_bytes, chunk_size)),
         chunk_ids(grad_base, place(grad_offset, layer.grad_bytes, chunk_size)),
         chunk_ids(optimizer_base, place(optimizer_offset, layer.optimizer_bytes, chunk_size))});
  }
  return layer_step_trace(model, chunks);
}

plan::StepTrace layer_step_trace(const ModelSpec& model, const std::vector<LayerChunks>& chunks) {
  plan::StepTrace trace;
  std::uint64_t live_activations = 0;
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    live_activations += model.layers[l].activation_bytes;
    plan::TracedOp op{
        "forward." + model.layers[l].name, model.layers[l].forward_ns, live_activations, {}};
    use(op, chunks[l].params, false);
    trace.ops.push_back(std::move(op));
  }
  for (std::size_t l = model.layers.size(); l-- > 0;) {
    plan::TracedOp op{
        "backward." + model.layers[l].name, model.layers[l].backward_ns, live_activations, {}};
    use(op, chunks[l].params, false);
    use(op, chunks[l].grads, true);
    trace.ops.push_back(std::move(op));
    live_activations -= model.layers[l].activation_bytes;
  }
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    plan::TracedOp op{"optimizer." + model.layers[l].name, model.layers[l].optimizer_ns, 0, {}};
    use(op, chunks[l].params, true);
    use(op, chunks[l].grads, false);
    use(op, chunks[l].optimizer, true);
    trace.ops.push_back(std::move(op));
  }
  return trace;
}

}  // namespace spillway::sim
