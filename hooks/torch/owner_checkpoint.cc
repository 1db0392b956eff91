// Checkpoints by owner from C++: the format of Note [Checkpoints by owner]
// (python/spillway/_owner_checkpoint.py), written and read by LibTorch.
//
// Note [Checkpoints by owner from C++]
// The files are the Python package's, so a checkpoint saved from C++ loads
// from Python, consolidates with `python -m spillway.consolidate` into a
// plain torch state_dict, and the other way round: manifest.json as JSON,
// each rank's shard in torch.save's archive, which torch.load reads with
// weights_only too (plain dicts and lists, tuples, tensors; no type tags),
// and torch::pickle_load reads the Python package's. The
// optimizer state is written in torch.optim's layout, by name: Adam's and
// AdamW's "step" (a float32 scalar, as torch.optim keeps it), "exp_avg",
// "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq"; SGD's
// "momentum_buffer"; each param group's options under torch.optim's keys.
// spillway's chunked optimizers (spillway::optim), whose state is in chunks,
// write what the Python package's spillway.optim state_dict holds: the same
// names, plus "master" for a bf16/fp16 parameter's fp32 copy. So Adam, AdamW
// and SGD, torch::optim's and spillway::optim's, are understood; any other
// optimizer is refused by name rather than saved without its state.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include "hooks/torch/data_parallel.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/sim_torch_allocator.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway {

namespace {

constexpr std::string_view kFormat = "spillway-checkpoint-by-owner";
constexpr int kVersion = 1;
constexpr std::string_view kManifest = "manifest.json";

namespace fs = std::filesystem;
using Entries = std::vector<std::pair<std::string, torch::Tensor>>;

std::string shard_name(int rank, int world) {
  return fmt::format("rank{:05d}-of-{:05d}.pt", rank, world);
}

// torch's names for dtypes, as the Python package writes them.
std::string python_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kHalf:
      return "torch.float16";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kLong:
      return "torch.int64";
    case at::kInt:
      return "torch.int32";
    case at::kShort:
      return "torch.int16";
    case at::kChar:
      return "torch.int8";
    case at::kByte:
      return "torch.uint8";
    case at::kBool:
      return "torch.bool";
    default:
      throw CheckpointError(fmt::format(
          "a checkpoint by owner from C++ writes tensors of float, integer and bool dtypes; a {} "
          "tensor is none of them",
          c10::toString(dtype)));
  }
}

// The module's state_dict entries by name: its parameters, then its buffers.
Entries module_entries(const torch::nn::Module& module) {
  Entries entries;
  for (const auto& item : module.named_parameters()) entries.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) entries.emplace_back(item.key(), item.value());
  return entries;
}

// The rank that writes each tensor: its owner, or rank 0 for one spillway
// does not manage (every rank holds it).
std::vector<int> writers(const std::vector<torch::Tensor>& tensors) {
  std::vector<int> owners = data_parallel_owners(tensors);
  for (int& owner : owners) owner = std::max(owner, 0);
  return owners;
}

std::vector<torch::Tensor> tensors_of(const Entries& entries) {
  std::vector<torch::Tensor> tensors;
  for (const auto& entry : entries) tensors.push_back(entry.second);
  return tensors;
}

// A host copy, read through an op: the op hooks fetch the chunk wherever it is.
torch::Tensor host_copy(const torch::Tensor& tensor) {
  torch_bridge::HostWorkScope host;
  at::NoGradGuard no_grad;
  return tensor.detach().clone();
}

// torch::pickle_save tags every dict and list with its element types (the
// global torch.jit._pickle.restore_type_tag), which torch.load refuses under
// weights_only; the same archive without the tags is what torch.save writes.
std::string python_loadable_pickle(const c10::IValue& value) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* bytes, std::size_t size) {
        pickled.insert(pickled.end(), bytes, bytes + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string archive;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t size) {
    archive.append(static_cast<const char*>(bytes), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return archive;
}

void make_folder(const fs::path& folder) {
  std::error_code error;
  fs::create_directories(folder, error);
  if (error)
    throw CheckpointError(fmt::format("could not make the checkpoint folder {}: {}",
                                      folder.string(), error.message()));
}

void write_bytes_atomically(const fs::path& path, const std::string& bytes) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    file.close();
    if (!file) throw CheckpointError(fmt::format("could not write {}", partial.string()));
  }
  std::error_code error;
  fs::rename(partial, path, error);
  if (error)
    throw CheckpointError(fmt::format("could not rename {} to {}: {}", partial.string(),
                                      path.string(), error.message()));
}

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// --- The optimizers understood ------------------------------------------------

enum class OptimizerKind { adam, adamw, sgd };

std::optional<OptimizerKind> kind_of(const torch::optim::Optimizer& optimizer) {
  const torch::optim::Optimizer* any = &optimizer;
  if (dynamic_cast<const torch::optim::Adam*>(any) || dynamic_cast<const optim::Adam*>(any))
    return OptimizerKind::adam;
  if (dynamic_cast<const torch::optim::AdamW*>(any) || dynamic_cast<const optim::AdamW*>(any))
    return OptimizerKind::adamw;
  if (dynamic_cast<const torch::optim::SGD*>(any) || dynamic_cast<const optim::SGD*>(any))
    return OptimizerKind::sgd;
  return std::nullopt;
}

// spillway's chunked optimizers keep their state in chunks, not in state()
// (Note [Chunked optimizer state is not in state()]): param_state and
// set_param_state carry it, in the Python package's layout.
optim::ChunkedOptimizer* chunked(torch::optim::Optimizer& optimizer) {
  return dynamic_cast<optim::ChunkedOptimizer*>(&optimizer);
}

// A flat state array (over the parameter's whole storage) in the parameter's
// shape where the counts agree, as the Python package's state_dict gives it.
torch::Tensor shaped(const torch::Tensor& values, const torch::Tensor& param) {
  return values.numel() == param.numel() ? values.view(param.sizes()) : values;
}

std::optional<c10::impl::GenericDict> chunked_state_dict_of(optim::ChunkedOptimizer& optimizer,
                                                            OptimizerKind kind,
                                                            const torch::Tensor& param) {
  const std::optional<optim::ChunkedOptimizer::ParamState> state = optimizer.param_state(param);
  if (!state.has_value() || !state->started) return std::nullopt;  // as torch, before a step
  c10::impl::GenericDict dict = string_dict();
  torch_bridge::HostWorkScope host;
  if (kind == OptimizerKind::sgd) {
    dict.insert("momentum_buffer",
                state->slots.empty() ? c10::IValue() : c10::IValue(shaped(state->slots[0], param)));
    dict.insert("step", state->step);
  } else {
    dict.insert("step", at::scalar_tensor(static_cast<double>(state->step), at::kFloat));
    dict.insert("exp_avg", shaped(state->slots.at(0), param));
    dict.insert("exp_avg_sq", shaped(state->slots.at(1), param));
  }
  if (state->master.defined()) dict.insert("master", shaped(state->master, param));
  return dict;
}

std::string_view class_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adam:
      return "Adam";
    case OptimizerKind::adamw:
      return "AdamW";
    case OptimizerKind::sgd:
      return "SGD";
  }
  return "";
}

OptimizerKind checked_kind(const torch::optim::Optimizer& optimizer) {
  if (const std::optional<OptimizerKind> kind = kind_of(optimizer)) return *kind;
  throw CheckpointError(fmt::format(
      "a checkpoint by owner from C++ saves the state of Adam, AdamW and SGD, torch::optim's "
      "and spillway::optim's (Note [Checkpoints by owner from C++]); this optimizer ({}) is none "
      "of them",
      c10::demangle(typeid(optimizer).name())));
}

template <typename State>
void put_adam_state(c10::impl::GenericDict& dict, const State& state, bool amsgrad) {
  dict.insert("step", at::scalar_tensor(static_cast<double>(state.step()), at::kFloat));
  dict.insert("exp_avg", host_copy(state.exp_avg()));
  dict.insert("exp_avg_sq", host_copy(state.exp_avg_sq()));
  if (amsgrad) dict.insert("max_exp_avg_sq", host_copy(state.max_exp_avg_sq()));
}

// `param`'s state in torch.optim's layout; nullopt where it has none.
std::optional<c10::impl::GenericDict> state_dict_of(torch::optim::Optimizer& optimizer,
                                                    OptimizerKind kind,
                                                    const torch::optim::OptimizerOptions& options,
                                                    const torch::Tensor& param) {
  if (optim::ChunkedOptimizer* held = chunked(optimizer))
    return chunked_state_dict_of(*held, kind, param);
  const auto found = optimizer.state().find(param.unsafeGetTensorImpl());
  if (found == optimizer.state().end()) return std::nullopt;
  c10::impl::GenericDict dict = string_dict();
  switch (kind) {
    case OptimizerKind::adam:
      put_adam_state(dict, static_cast<const torch::optim::AdamParamState&>(*found->second),
                     static_cast<const torch::optim::AdamOptions&>(options).amsgrad());
      break;
    case OptimizerKind::adamw:
      put_adam_state(dict, static_cast<const torch::optim::AdamWParamState&>(*found->second),
                     static_cast<const torch::optim::AdamWOptions&>(options).amsgrad());
      break;
    case OptimizerKind::sgd: {
      const auto& state = static_cast<const torch::optim::SGDParamState&>(*found->second);
      if (!state.momentum_buffer().defined()) return std::nullopt;
      dict.insert("momentum_buffer", host_copy(state.momentum_buffer()));
      break;
    }
  }
  return dict;
}

c10::impl::GenericDict group_options(OptimizerKind kind,
                                     const torch::optim::OptimizerOptions& options) {
  c10::impl::GenericDict group = string_dict();
  const auto put_adam = [&](const auto& adam, bool decoupled) {
    group.insert("lr", adam.lr());
    group.insert("betas",
                 c10::ivalue::Tuple::create(std::get<0>(adam.betas()), std::get<1>(adam.betas())));
    group.insert("eps", adam.eps());
    group.insert("weight_decay", adam.weight_decay());
    group.insert("amsgrad", adam.amsgrad());
    group.insert("decoupled_weight_decay", decoupled);  // what tells torch.optim's AdamW
  };
  switch (kind) {
    case OptimizerKind::adam:
      put_adam(static_cast<const torch::optim::AdamOptions&>(options), false);
      break;
    case OptimizerKind::adamw:
      put_adam(static_cast<const torch::optim::AdamWOptions&>(options), true);
      break;
    case OptimizerKind::sgd: {
      const auto& sgd = static_cast<const torch::optim::SGDOptions&>(options);
      group.insert("lr", sgd.lr());
      group.insert("momentum", sgd.momentum());
      group.insert("dampening", sgd.dampening());
      group.insert("weight_decay", sgd.weight_decay());
      group.insert("nesterov", sgd.nesterov());
      break;
    }
  }
  return group;
}

// --- Names --------------------------------------------------------------------

// The name of each of the optimizer's parameters, in its order.
std::vector<std::string> optimizer_names(const torch::optim::Optimizer& optimizer,
                                         const torch::nn::Module& module) {
  std::map<const void*, std::string> names;
  for (const auto& item : module.named_parameters())
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::vector<std::string> result;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      const auto found = names.find(param.unsafeGetTensorImpl());
      if (found == names.end())
        throw CheckpointError(fmt::format(
            "the optimizer's parameter #{} ({}) is not a parameter of the module: a checkpoint by "
            "owner keys the state by the module's names",
            result.size(), fmt::join(param.sizes(), ", ")));
      result.push_back(found->second);
    }
  }
  return result;
}

std::vector<torch::Tensor> optimizer_params(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (const auto& group : optimizer.param_groups())
    for (const torch::Tensor& param : group.params()) params.push_back(param);
  return params;
}

// --- Reading ------------------------------------------------------------------

nlohmann::json read_manifest(const fs::path& directory) {
  const fs::path path = directory / kManifest;
  if (!fs::is_regular_file(path))
    throw CheckpointError(fmt::format(
        "{} does not exist: {} is not a complete checkpoint by owner (a save that did not finish "
        "writes no manifest)",
        path.string(), directory.string()));
  nlohmann::json manifest;
  try {
    std::ifstream file(path);
    manifest = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    throw CheckpointError(fmt::format("{} cannot be read: {}", path.string(), error.what()));
  }
  if (!manifest.is_object() || manifest.value("format", "") != kFormat)
    throw CheckpointError(
        fmt::format("{} is not a manifest of a checkpoint by owner (its format is not '{}')",
                    path.string(), kFormat));
  if (manifest.value("version", -1) != kVersion)
    throw CheckpointError(fmt::format("{} has version {}; this spillway reads version {}",
                                      path.string(), manifest["version"].dump(), kVersion));
  for (const char* key : {"world_size", "shards", "module", "optimizer"})
    if (!manifest.contains(key))
      throw CheckpointError(fmt::format("{} lacks {}", path.string(), key));
  const auto shards = static_cast<int>(manifest["shards"].size());
  for (const auto& [name, info] : manifest["module"].items()) {
    const int shard = info.value("shard", -1);
    if (shard < 0 || shard >= shards)
      throw CheckpointError(
          fmt::format("{} puts '{}' in shard {}, of {}", path.string(), name, shard, shards));
  }
  return manifest;
}

c10::impl::GenericDict read_shard(const fs::path& directory, const nlohmann::json& manifest,
                                  int index) {
  const fs::path path =
      directory / manifest["shards"][static_cast<std::size_t>(index)].get<std::string>();
  if (!fs::is_regular_file(path))
    throw CheckpointError(
        fmt::format("{}, shard {} of the checkpoint, does not exist", path.string(), index));
  std::ifstream file(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(file),
                                std::istreambuf_iterator<char>()};
  try {
    torch_bridge::HostWorkScope host;  // host data, off the device budget
    const c10::IValue value = torch::pickle_load(bytes);
    if (!value.isGenericDict()) throw std::runtime_error("its top level is not a dict");
    return value.toGenericDict();
  } catch (const std::exception& error) {
    throw CheckpointError(fmt::format("{}, shard {} of the checkpoint, cannot be read: {}",
                                      path.string(), index, error.what()));
  }
}

c10::IValue lookup(const c10::impl::GenericDict& dict, const std::string& key,
                   const std::string& where) {
  const auto found = dict.find(key);
  if (found == dict.end()) throw CheckpointError(fmt::format("{} lacks '{}'", where, key));
  return found->value();
}

void check_module_fits(const nlohmann::json& manifest, const Entries& entries,
                       const std::string& directory) {
  const nlohmann::json& saved = manifest["module"];
  std::vector<std::string> missing, unexpected;
  std::set<std::string> names;
  for (const auto& [name, tensor] : entries) {
    names.insert(name);
    if (!saved.contains(name)) missing.push_back(name);
  }
  for (const auto& [name, info] : saved.items())
    if (!names.contains(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty())
    throw CheckpointError(
        fmt::format("the checkpoint in {} does not fit the module: missing [{}], unexpected [{}]",
                    directory, fmt::join(missing, ", "), fmt::join(unexpected, ", ")));
  for (const auto& [name, tensor] : entries) {
    const nlohmann::json& info = saved[name];
    const std::vector<std::int64_t> shape = info.value("shape", std::vector<std::int64_t>{});
    if (shape != tensor.sizes().vec() ||
        info.value("dtype", "") != python_dtype(tensor.scalar_type()))
      throw CheckpointError(
          fmt::format("'{}' is {} [{}] in the checkpoint in {}, the module's is {} [{}]", name,
                      info.value("dtype", "?"), fmt::join(shape, ", "), directory,
                      python_dtype(tensor.scalar_type()), fmt::join(tensor.sizes(), ", ")));
  }
}

template <typename Options>
void set_adam_options(Options& options, const c10::impl::GenericDict& group,
                      const std::string& where) {
  options.lr(lookup(group, "lr", where).toDouble());
  const auto betas = lookup(group, "betas", where).toTupleRef().elements();
  options.betas(std::make_tuple(betas.at(0).toDouble(), betas.at(1).toDouble()));
  options.eps(lookup(group, "eps", where).toDouble());
  options.weight_decay(lookup(group, "weight_decay", where).toDouble());
  options.amsgrad(lookup(group, "amsgrad", where).toBool());
}

void set_group_options(OptimizerKind kind, torch::optim::OptimizerOptions& options,
                       const c10::impl::GenericDict& group, const std::string& where) {
  switch (kind) {
    case OptimizerKind::adam:
      set_adam_options(static_cast<torch::optim::AdamOptions&>(options), group, where);
      break;
    case OptimizerKind::adamw:
      set_adam_options(static_cast<torch::optim::AdamWOptions&>(options), group, where);
      break;
    case OptimizerKind::sgd: {
      auto& sgd = static_cast<torch::optim::SGDOptions&>(options);
      sgd.lr(lookup(group, "lr", where).toDouble());
      sgd.momentum(lookup(group, "momentum", where).toDouble());
      sgd.dampening(lookup(group, "dampening", where).toDouble());
      sgd.weight_decay(lookup(group, "weight_decay", where).toDouble());
      sgd.nesterov(lookup(group, "nesterov", where).toBool());
      break;
    }
  }
}

// A copy of `saved` on `param`'s device and in its dtype, for the state.
torch::Tensor state_like(const c10::impl::GenericDict& state, const std::string& key,
                         const torch::Tensor& param, const std::string& where) {
  const torch::Tensor saved = lookup(state, key, where).toTensor();
  if (saved.sizes() != param.sizes())
    throw CheckpointError(fmt::format("{}: '{}' is [{}], the parameter [{}]", where, key,
                                      fmt::join(saved.sizes(), ", "),
                                      fmt::join(param.sizes(), ", ")));
  return saved.to(param.device(), saved.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

template <typename State>
std::unique_ptr<State> adam_state(const c10::impl::GenericDict& saved, const torch::Tensor& param,
                                  bool amsgrad, const std::string& where) {
  auto state = std::make_unique<State>();
  state->step(static_cast<std::int64_t>(lookup(saved, "step", where).toTensor().item<double>()));
  state->exp_avg(state_like(saved, "exp_avg", param, where));
  state->exp_avg_sq(state_like(saved, "exp_avg_sq", param, where));
  if (amsgrad) state->max_exp_avg_sq(state_like(saved, "max_exp_avg_sq", param, where));
  return state;
}

// The Python package's load_state_dict for a chunked optimizer: the slots
// present, "step" (a tensor, or SGD's integer), "master" where saved.
void set_chunked_state(optim::ChunkedOptimizer& optimizer, OptimizerKind kind,
                       const torch::optim::OptimizerOptions& options,
                       const c10::impl::GenericDict& saved, const torch::Tensor& param,
                       const std::string& where) {
  const auto flat = [](const torch::Tensor& values) {
    torch_bridge::HostWorkScope host;
    return values.detach().to(at::kCPU, at::kFloat).reshape({-1}).contiguous();
  };
  optim::ChunkedOptimizer::ParamState state;
  const std::vector<std::string> names = kind == OptimizerKind::sgd
                                             ? std::vector<std::string>{"momentum_buffer"}
                                             : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  std::size_t wanted = names.size();
  if (kind == OptimizerKind::sgd &&
      static_cast<const torch::optim::SGDOptions&>(options).momentum() == 0)
    wanted = 0;
  for (std::size_t i = 0; i < wanted; ++i) {
    const auto found = saved.find(names[i]);
    if (found != saved.end() && found->value().isTensor())
      state.slots.push_back(flat(found->value().toTensor()));
  }
  // SGD's momentum_buffer None: the next step starts the buffer afresh.
  state.started = state.slots.size() == wanted;
  const auto step = saved.find("step");
  if (step != saved.end())
    state.step = step->value().isTensor()
                     ? static_cast<std::int64_t>(step->value().toTensor().item<double>())
                     : step->value().toInt();
  const auto master = saved.find("master");
  if (master != saved.end() && master->value().isTensor())
    state.master = flat(master->value().toTensor());
  try {
    optimizer.set_param_state(param, state);
  } catch (const std::invalid_argument& error) {
    throw CheckpointError(fmt::format("{}: {}", where, error.what()));
  }
}

std::unique_ptr<torch::optim::OptimizerParamState> param_state(
    OptimizerKind kind, const torch::optim::OptimizerOptions& options,
    const c10::impl::GenericDict& saved, const torch::Tensor& param, const std::string& where) {
  switch (kind) {
    case OptimizerKind::adam:
      return adam_state<torch::optim::AdamParamState>(
          saved, param, static_cast<const torch::optim::AdamOptions&>(options).amsgrad(), where);
    case OptimizerKind::adamw:
      return adam_state<torch::optim::AdamWParamState>(
          saved, param, static_cast<const torch::optim::AdamWOptions&>(options).amsgrad(), where);
    case OptimizerKind::sgd: {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(state_like(saved, "momentum_buffer", param, where));
      return state;
    }
  }
  return nullptr;
}

}  // namespace

void save_checkpoint(const std::string& directory, torch::nn::Module& module,
                     torch::optim::Optimizer* optimizer) {
  const fs::path folder(directory);
  const int rank = data_parallel_rank();
  const int world = data_parallel_world_size();
  const std::optional<OptimizerKind> kind =
      optimizer != nullptr ? std::optional(checked_kind(*optimizer)) : std::nullopt;
  const fs::path manifest_path = folder / kManifest;
  if (rank == 0) {
    make_folder(folder);
    std::error_code error;
    fs::remove(manifest_path, error);
    if (error)
      throw CheckpointError(
          fmt::format("could not remove the old {}: {}", manifest_path.string(), error.message()));
  }
  torch_bridge::barrier("starting a checkpoint");  // no rank writes before the old manifest is gone
  make_folder(folder);

  const Entries entries = module_entries(module);
  const std::vector<int> entry_writers = writers(tensors_of(entries));
  c10::impl::GenericDict module_values = string_dict();
  {
    // Note [Uses only the owner makes] (sharded_params.cc): what this rank writes.
    const torch_bridge::OwnerUses owner_uses;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (entry_writers[i] == rank)
        module_values.insert(entries[i].first, host_copy(entries[i].second));
  }
  c10::impl::GenericDict optimizer_state = string_dict();
  c10::impl::GenericDict shard = string_dict();

  nlohmann::json state_owners = nlohmann::json::object();
  if (optimizer != nullptr) {
    const std::vector<std::string> names = optimizer_names(*optimizer, module);
    const std::vector<torch::Tensor> params = optimizer_params(*optimizer);
    const std::vector<int> param_writers = writers(params);
    std::vector<std::optional<double>> written(params.size());
    std::size_t index = 0;
    for (const auto& group : optimizer->param_groups()) {
      for (const torch::Tensor& param : group.params()) {
        if (param_writers[index] == rank) {
          if (auto state = state_dict_of(*optimizer, *kind, group.options(), param)) {
            optimizer_state.insert(names[index], *state);
            written[index] = 1.0;
          }
        }
        ++index;
      }
    }
    // Which parameters have state at all is known on their writers only.
    written =
        torch_bridge::owned_figures_everywhere(written, "which parameters have optimizer state");
    for (std::size_t i = 0; i < params.size(); ++i)
      if (written[i].has_value()) state_owners[names[i]] = param_writers[i];
    if (rank == 0) {
      c10::impl::GenericList groups(c10::AnyType::get());
      std::size_t position = 0;
      for (const auto& group : optimizer->param_groups()) {
        c10::impl::GenericDict saved = group_options(*kind, group.options());
        c10::impl::GenericList group_names(c10::AnyType::get());
        for (std::size_t i = 0; i < group.params().size(); ++i)
          group_names.push_back(names[position++]);
        saved.insert("params", group_names);
        groups.push_back(saved);
      }
      shard.insert("optimizer_param_groups", groups);
    }
  }
  shard.insert("module", module_values);
  shard.insert("optimizer_state", optimizer_state);
  write_bytes_atomically(folder / shard_name(rank, world), python_loadable_pickle(shard));
  torch_bridge::barrier("writing the checkpoint's shards");  // every shard is in place
  if (rank != 0) return;

  nlohmann::json manifest = {{"format", kFormat}, {"version", kVersion}, {"world_size", world}};
  manifest["shards"] = nlohmann::json::array();
  for (int r = 0; r < world; ++r) manifest["shards"].push_back(shard_name(r, world));
  manifest["module"] = nlohmann::json::object();
  for (std::size_t i = 0; i < entries.size(); ++i)
    manifest["module"][entries[i].first] = {
        {"shard", entry_writers[i]},
        {"dtype", python_dtype(entries[i].second.scalar_type())},
        {"shape", entries[i].second.sizes().vec()}};
  manifest["optimizer"] =
      optimizer == nullptr ? nlohmann::json(nullptr)
                           : nlohmann::json{{"class", class_name(*kind)}, {"state", state_owners}};
  write_bytes_atomically(manifest_path, manifest.dump(1));
}

namespace {

void load_into(const std::string& directory, torch::nn::Module& module,
               torch::optim::Optimizer* optimizer) {
  const fs::path folder(directory);
  const nlohmann::json manifest = read_manifest(folder);
  const Entries entries = module_entries(module);
  check_module_fits(manifest, entries, directory);
  std::vector<c10::impl::GenericDict> shards;
  for (int index = 0; index < static_cast<int>(manifest["shards"].size()); ++index)
    shards.push_back(read_shard(folder, manifest, index));

  {
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : entries) {
      const int index = manifest["module"][name]["shard"].get<int>();
      const std::string where = fmt::format("shard {} of the checkpoint in {}", index, directory);
      const auto held =
          lookup(shards[static_cast<std::size_t>(index)], "module", where).toGenericDict();
      const auto found = held.find(name);
      if (found == held.end())
        throw CheckpointError(fmt::format("'{}' is missing from {}", name, where));
      tensor.copy_(found->value().toTensor());  // an op: the chunk is fetched
    }
  }
  if (optimizer == nullptr) return;

  const OptimizerKind kind = checked_kind(*optimizer);
  if (manifest["optimizer"].is_null())
    throw CheckpointError(fmt::format("the checkpoint in {} holds no optimizer state", directory));
  const std::string saved_class = manifest["optimizer"].value("class", "");
  if (saved_class != class_name(kind))
    throw CheckpointError(fmt::format("the checkpoint in {} holds the state of {}, not of {}",
                                      directory, saved_class, class_name(kind)));
  const std::string where0 = fmt::format("shard 0 of the checkpoint in {}", directory);
  const c10::List<c10::IValue> saved_groups =
      lookup(shards[0], "optimizer_param_groups", where0).toList();
  const std::vector<std::string> names = optimizer_names(*optimizer, module);
  std::vector<std::string> saved_names;
  for (const c10::IValue group : saved_groups)
    for (const c10::IValue name : lookup(group.toGenericDict(), "params", where0).toList())
      saved_names.push_back(name.toStringRef());
  if (saved_names != names || saved_groups.size() != optimizer->param_groups().size())
    throw CheckpointError(fmt::format(
        "the optimizer's parameters are not those of the checkpoint in {}, in that order, in "
        "{} groups (saved {} parameters in {} groups, this optimizer has {})",
        directory, optimizer->param_groups().size(), saved_names.size(), saved_groups.size(),
        names.size()));

  const std::vector<int> owners = data_parallel_owners(optimizer_params(*optimizer));
  const int rank = data_parallel_rank();
  const nlohmann::json& state_shards = manifest["optimizer"]["state"];
  std::size_t index = 0;
  for (std::size_t g = 0; g < saved_groups.size(); ++g) {
    auto& group = optimizer->param_groups()[g];
    set_group_options(kind, group.options(), saved_groups.get(g).toGenericDict(), where0);
    for (const torch::Tensor& param : group.params()) {
      const std::string& name = names[index];
      const int owner = owners[index++];
      optim::ChunkedOptimizer* chunked_optimizer = chunked(*optimizer);
      if (chunked_optimizer == nullptr) optimizer->state().erase(param.unsafeGetTensorImpl());
      // This rank takes the state of what it owns now, and of what no rank owns.
      if ((owner != rank && owner != -1) || !state_shards.contains(name)) continue;
      const int shard = state_shards[name].get<int>();
      const std::string where =
          fmt::format("the optimizer state of '{}' in shard {} of the checkpoint in {}", name,
                      shard, directory);
      if (shard < 0 || shard >= static_cast<int>(shards.size()))
        throw CheckpointError(fmt::format("{}: no such shard", where));
      const auto held =
          lookup(shards[static_cast<std::size_t>(shard)], "optimizer_state", where).toGenericDict();
      const auto found = held.find(name);
      if (found == held.end()) throw CheckpointError(fmt::format("{} is missing", where));
      if (chunked_optimizer != nullptr)
        set_chunked_state(*chunked_optimizer, kind, group.options(), found->value().toGenericDict(),
                          param, where);
      else
        optimizer->state()[param.unsafeGetTensorImpl()] =
            param_state(kind, group.options(), found->value().toGenericDict(), param, where);
    }
  }
}

}  // namespace

void load_checkpoint(const std::string& directory, torch::nn::Module& module,
                     torch::optim::Optimizer* optimizer) {
  // A value of another type than the format's (a manifest entry, an option,
  // a state tensor that is None) throws from nlohmann or from IValue's
  // accessors: each is a checkpoint that does not fit, said as one.
  try {
    load_into(directory, module, optimizer);
  } catch (const nlohmann::json::exception& error) {
    throw CheckpointError(
        fmt::format("the manifest of the checkpoint in {} is not as a "
                    "checkpoint by owner writes it: {}",
                    directory, error.what()));
  } catch (const c10::Error& error) {
    throw CheckpointError(fmt::format("the checkpoint in {} does not fit: {}", directory,
                                      error.what_without_backtrace()));
  }
}

}  // namespace spillway
