// Model descriptions: JSON parsing, the GPT generator, and the chunk layout.
// Layers of one kind are packed back to back, so a layer may share a chunk
// with its neighbours, as tensors registered in order share chunks in the
// chunk manager.
#include "tools/sim/model_description.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace spillway::sim {
namespace {

using nlohmann::json;

std::uint64_t field(const json& object, const char* key, const std::string& where,
                    std::uint64_t fallback, bool required) {
  auto found = object.find(key);
  if (found == object.end()) {
    if (required) throw ModelError(where + ": missing \"" + key + "\"");
    return fallback;
  }
  if (found->is_number_unsigned()) return found->get<std::uint64_t>();
  if (found->is_number_float() && found->get<double>() >= 0) {
    return static_cast<std::uint64_t>(found->get<double>());
  }
  throw ModelError(where + ": \"" + key + "\" must be a non-negative number");
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
    if (auto f = gpt->find("flops_per_s"); f != gpt->end()) spec.flops_per_s = f->get<double>();
    if (auto f = gpt->find("optimizer_bytes_per_s"); f != gpt->end()) {
      spec.optimizer_bytes_per_s = f->get<double>();
    }
    ModelSpec model = gpt_model(spec);
    if (root.contains("name")) model.name = root["name"].get<std::string>();
    return model;
  }
  auto layers = root.find("layers");
  if (layers == root.end() || !layers->is_array() || layers->empty()) {
    throw ModelError("the description needs a non-empty \"layers\" array or a \"gpt\" object");
  }
  ModelSpec model;
  model.name = root.value("name", "model");
  const std::uint64_t repeat = field(root, "repeat", "description", 1, false);
  for (std::uint64_t r = 0; r < repeat; ++r) {
    for (std::size_t i = 0; i < layers->size(); ++i) {
      const json& entry = (*layers)[i];
      const std::string where = "layers[" + std::to_string(i) + "]";
      if (!entry.is_object()) throw ModelError(where + ": must be an object");
      LayerSpec layer;
      layer.name = entry.value("name", "layer" + std::to_string(i));
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
  std::uint64_t param_total = 0, grad_total = 0;
  for (const LayerSpec& layer : model.layers) {
    param_total += layer.param_bytes;
    grad_total += layer.grad_bytes;
  }
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
