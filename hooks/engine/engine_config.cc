#include "hooks/engine/engine_config.h"

#include <cctype>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "allocator/config/config.h"
#include "hooks/engine/json_fields.h"
#include "hooks/engine/read_lr_schedule.h"

namespace spillway::engine {
namespace {

using nlohmann::json;

// "auto" is what the Hugging Face Trainer writes for the values it fills in
// before DeepSpeed reads the config; DeepSpeed itself rejects it.
void refuse_auto(const json& object, const char* key, const std::string& path) {
  if (object.contains(key) && object.at(key) == "auto")
    reject(join(path, key),
           "\"auto\" is filled in by the Hugging Face Trainer before DeepSpeed reads the config; "
           "DeepSpeed itself rejects it, and so does spillway: give the value");
}

OptimizerType optimizer_type(const json& value) {
  if (!value.is_string())
    reject("optimizer.type", fmt::format("expected a string, got {}", value.dump()));
  std::string name = value.get<std::string>();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "adam") return OptimizerType::adam;
  if (name == "adamw") return OptimizerType::adamw;
  if (name == "sgd") return OptimizerType::sgd;
  // DeepSpeed's own optimizers and torch's others, which spillway lacks.
  for (const char* other : {"onebitadam", "onebitlamb", "zerooneadam", "lamb", "lion", "adagrad",
                            "muadam", "muadamw", "musgd", "muon", "rmsprop", "adamax", "adadelta",
                            "nadam", "radam", "asgd", "rprop", "lbfgs", "sparseadam"}) {
    if (name == other)
      reject("optimizer.type",
             fmt::format("{} is not in spillway, which offers Adam, AdamW and SGD (torch's, "
                         "bit for bit, stepped on the GPU or, for chunks in CPU memory, by "
                         "spillway's CPU Adam)",
                         value.dump()));
  }
  reject("optimizer.type", fmt::format("expected Adam, AdamW or SGD, got {}", value.dump()));
}

// A boolean parameter spillway computes only one way: `supported` is
// accepted, the other value refused with `why`.
void only_value(const json& params, const char* key, const std::string& path, bool supported,
                const char* why) {
  if (bool_at(params, key, path, supported) != supported) reject(join(path, key), why);
}

OptimizerConfig parse_optimizer(const json& root) {
  if (!root.contains("optimizer")) reject("optimizer", "required (an object with type and params)");
  const json& block = object_at(root, "optimizer", "");
  check_keys(block, "optimizer", {"type", "params", "legacy_fusion"});
  if (block.contains("legacy_fusion"))
    only_value(block, "legacy_fusion", "optimizer", false,
               "DeepSpeed's legacy fused-Adam fp16 step is not in spillway; remove it or set it "
               "false (the default)");
  if (!block.contains("type")) reject("optimizer.type", "required (Adam, AdamW or SGD)");
  OptimizerConfig config;
  config.type = optimizer_type(block.at("type"));
  const json no_params = json::object();
  const json& params =
      block.contains("params") ? object_at(block, "params", "optimizer") : no_params;
  const std::string path = "optimizer.params";
  if (params.contains("max_grad_norm"))
    reject(join(path, "max_grad_norm"),
           "not an optimizer parameter (DeepSpeed refuses it too): use the top-level "
           "gradient_clipping");
  for (const char* key : {"lr", "weight_decay", "eps", "momentum", "betas"})
    refuse_auto(params, key, path);
  if (config.type == OptimizerType::sgd) {
    check_keys(params, path,
               {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
                "differentiable", "fused"});
    config.lr = number_at(params, "lr", path, 1e-3, 0);
    config.momentum = number_at(params, "momentum", path, 0, 0);
    config.dampening = number_at(params, "dampening", path, 0, 0);
    config.weight_decay = number_at(params, "weight_decay", path, 0, 0);
    config.nesterov = bool_at(params, "nesterov", path, false);
    if (config.nesterov && (config.momentum <= 0 || config.dampening != 0))
      reject(join(path, "nesterov"), "needs momentum > 0 and dampening 0");
    only_value(params, "maximize", path, false, "spillway's SGD minimizes; maximize is not in it");
    // torch's kernel choices: the same numbers whichever kernel runs.
    for (const char* key : {"foreach", "fused"}) {
      if (params.contains(key) && !params.at(key).is_null()) bool_at(params, key, path, false);
    }
    only_value(params, "differentiable", path, false,
               "spillway's optimizer step is not differentiable");
    return config;
  }
  check_keys(
      params, path,
      {"lr", "betas", "eps", "weight_decay", "torch_adam", "adam_w_mode", "bias_correction",
       "amsgrad", "set_grad_none", "foreach", "fused", "capturable", "maximize", "differentiable"});
  // DeepSpeed: the type AdamW, or Adam with adam_w_mode (default true),
  // decouples weight decay; only Adam with adam_w_mode false is L2 Adam.
  const bool adam_w_mode = bool_at(params, "adam_w_mode", path, true);
  if (config.type == OptimizerType::adam && adam_w_mode) config.type = OptimizerType::adamw;
  config.torch_adam = bool_at(params, "torch_adam", path, false);
  only_value(params, "bias_correction", path, true,
             "spillway's Adam always corrects the moment bias (DeepSpeed's default); remove it "
             "or set it true");
  only_value(params, "amsgrad", path, false,
             "AMSGrad is not in spillway's Adam (and DeepSpeed's FusedAdam refuses it too); "
             "remove it or set it false");
  only_value(params, "maximize", path, false, "spillway's Adam minimizes; maximize is not in it");
  only_value(params, "differentiable", path, false,
             "spillway's optimizer step is not differentiable");
  for (const char* key : {"set_grad_none", "foreach", "fused", "capturable"}) {
    if (params.contains(key) && !params.at(key).is_null()) bool_at(params, key, path, false);
  }
  config.lr = number_at(params, "lr", path, config.lr, 0);
  config.eps = number_at(params, "eps", path, config.eps, 0);
  // torch.optim.AdamW defaults weight_decay to 0.01; FusedAdam, CPUAdam and
  // torch.optim.Adam to 0.
  const double default_decay = config.torch_adam && config.type == OptimizerType::adamw ? 1e-2 : 0;
  config.weight_decay = number_at(params, "weight_decay", path, default_decay, 0);
  if (params.contains("betas")) {
    const json& betas = params.at("betas");
    const bool valid = betas.is_array() && betas.size() == 2 && betas[0].is_number() &&
                       betas[1].is_number() && betas[0].get<double>() >= 0 &&
                       betas[0].get<double>() < 1 && betas[1].get<double>() >= 0 &&
                       betas[1].get<double>() < 1;
    if (!valid)
      reject(join(path, "betas"),
             fmt::format("expected [beta1, beta2] in [0, 1), got {}", betas.dump()));
    config.beta1 = betas[0].get<double>();
    config.beta2 = betas[1].get<double>();
  }
  return config;
}

bool parse_fp16(const json& root, const ZeroConfig& zero, LossScalerOptions& scaler) {
  if (!root.contains("fp16")) return false;
  const json block = without_auto(object_at(root, "fp16", ""));
  const std::string path = "fp16";
  check_keys(
      block, path,
      {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
       "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"});
  const bool enabled = bool_at(block, "enabled", path, false);
  only_value(block, "auto_cast", path, false,
             "spillway does not cast the model's inputs to fp16; cast them in the training loop "
             "(or the model's forward), or remove the key");
  only_value(block, "fp16_master_weights_and_grads", path, false,
             "spillway keeps fp32 master weights and gradients for fp16 training (DeepSpeed "
             "allows fp16 ones with DeepSpeedCPUAdam only); remove it or set it false");
  scaler.static_scale = number_at(block, "loss_scale", path, 0, 0);
  scaler.initial_scale_power =
      static_cast<int>(integer_at(block, "initial_scale_power", path, 16, 0));
  if (scaler.initial_scale_power > 64) reject("fp16.initial_scale_power", "expected at most 64");
  scaler.window = static_cast<int>(integer_at(block, "loss_scale_window", path, 1000, 1));
  scaler.hysteresis = static_cast<int>(integer_at(block, "hysteresis", path, 2, 1));
  scaler.consecutive_hysteresis = bool_at(block, "consecutive_hysteresis", path, false);
  // An integer in DeepSpeed's config (pydantic int).
  scaler.min_scale = static_cast<double>(integer_at(block, "min_loss_scale", path, 1, 1));
  // DeepSpeed without ZeRO steps fp16 with FP16_Optimizer (FusedAdam) or
  // FP16_UnfusedOptimizer (torch_adam, SGD), whose rule ignores hysteresis;
  // ZeRO's optimizers use DynamicLossScaler.
  scaler.rule = zero.stage > 0 ? LossScaleRule::zero_optimizer : LossScaleRule::fp16_optimizer;
  return enabled;
}

bool parse_bf16(const json& root) {
  // "bfloat16" is DeepSpeed's older name, read when "bf16" is absent.
  const char* key = root.contains("bf16") ? "bf16" : "bfloat16";
  if (!root.contains(key)) return false;
  const json& raw = object_at(root, key, "");
  const json block = without_auto(raw);
  check_keys(raw, key,
             {"enabled", "immediate_grad_update", "check_grad_overflow",
              "bf16_master_weights_and_grads", "bf16_optimizer_states"});
  const bool enabled = bool_at(block, "enabled", key, false);
  // When the bf16 gradients reach the fp32 accumulators: the same sums.
  bool_at(block, "immediate_grad_update", key, false);
  only_value(block, "check_grad_overflow", key, false,
             "spillway's bf16 training does not check gradients for overflow or skip steps "
             "(bf16 has fp32's range); remove it or set it false");
  only_value(block, "bf16_master_weights_and_grads", key, false,
             "spillway keeps fp32 master weights and gradients for bf16 training; remove it or "
             "set it false");
  only_value(block, "bf16_optimizer_states", key, false,
             "spillway keeps the optimizer states in fp32; remove it or set it false");
  return enabled;
}

// Top-level keys of DeepSpeed 0.18 that change nothing in a one-process
// spillway run; accepted with any value and listed in the start-up report.
constexpr const char* kNoEffectKeys[] = {
    "prescale_gradients",         // how gradients are averaged across ranks
    "gradient_predivide_factor",  // likewise
    "communication_data_type",    // dtype of the all-reduce
    "seq_parallel_communication_data_type",
    "zero_allow_untested_optimizer",  // lets ZeRO wrap a client optimizer
    "zero_force_ds_cpu_optimizer",    // DeepSpeed's CPUAdam check
    "dump_state",                     // prints DeepSpeed's engine state
    "memory_breakdown",               // DeepSpeed's see_memory_usage lines
    "sparse_gradients",               // sparse all-reduce of embeddings
    "disable_allgather",
    "dataloader_drop_last",  // deepspeed_io's data loader
    "checkpoint",            // DeepSpeed's checkpoint tag validation, loading
    "data_parallel_group",
    "use_data_before_expert_parallelism",
    "graph_harvesting",  // CUDA-graph capture of DeepSpeed's own norm and clip kernels
    "vocabulary_size",   // sizes DeepSpeed's sparse embedding all-reduce
    "comms_logger",      // logs DeepSpeed's collectives; one process has none
    "timers",            // DeepSpeed's throughput timer (logged at INFO, hidden by default)
};

// Top-level blocks of DeepSpeed features spillway lacks: refused when present
// and enabled, with what spillway offers instead; {"enabled": false} passes.
struct Refused {
  const char* key;
  const char* why;
};
constexpr Refused kRefusedBlocks[] = {
    {"pipeline",
     "pipeline parallelism is not in spillway (one process, one GPU); spillway fits "
     "a model larger than the GPU by spilling chunks to CPU memory"},
    {"tensor_parallel", "tensor parallelism (AutoTP) is not in spillway (one process, one GPU)"},
    {"sequence_parallel_size", "sequence parallelism is not in spillway (one process, one GPU)"},
    {"moe", "mixture-of-experts parallelism is not in spillway"},
    {"sparse_attention",
     "DeepSpeed's sparse attention kernels are not in spillway; use the "
     "model's own attention"},
    {"compression_training", "DeepSpeed's compression training is not in spillway"},
    {"data_efficiency",
     "DeepSpeed's data efficiency library is not in spillway; sample in "
     "the training loop's data loader"},
    {"curriculum_learning",
     "curriculum learning is not in spillway; order the data in the "
     "training loop's data loader"},
    {"aio",
     "asynchronous NVMe I/O is not in spillway, which spills to pinned CPU memory "
     "instead of NVMe"},
    {"flops_profiler", "DeepSpeed's flops profiler is not in spillway; use torch.profiler"},
    {"tensorboard",
     "DeepSpeed's monitors are not in spillway; log from the training loop "
     "(spillway's memory statistics come from its stats API)"},
    {"wandb", "DeepSpeed's monitors are not in spillway; log from the training loop"},
    {"csv_monitor", "DeepSpeed's monitors are not in spillway; log from the training loop"},
    {"comet", "DeepSpeed's monitors are not in spillway; log from the training loop"},
    {"elasticity", "DeepSpeed's elastic training is not in spillway (one process)"},
    {"autotuning",
     "DeepSpeed's autotuner is not in spillway; spillway sizes its placement from "
     "the device budget at run time"},
    {"eigenvalue", "DeepSpeed's eigenvalue computation is not in spillway"},
    {"progressive_layer_drop", "progressive layer dropping is not in spillway"},
    {"quantize_training", "DeepSpeed's quantized training (MoQ) is not in spillway"},
    {"weight_quantization", "DeepSpeed's weight quantization is not in spillway"},
    {"hybrid_engine", "DeepSpeed's hybrid engine is not in spillway"},
    {"nebula", "Nebula checkpointing is not in spillway"},
    {"amp", "NVIDIA Apex AMP is not in spillway; use \"fp16\" or \"bf16\""},
    {"torch_autocast",
     "DeepSpeed's torch.autocast integration is not in spillway; use \"fp16\" "
     "or \"bf16\", or call torch.autocast in the training loop"},
    {"compile",
     "DeepSpeed's compile options are not in spillway; call torch.compile on the "
     "model yourself"},
    {"activation_checkpointing",
     "DeepSpeed's activation checkpointing (partitioned or CPU-held activations) is not in "
     "spillway; use torch.utils.checkpoint in the model"},
    {"zenflow", "ZenFlow is not in spillway"},
};

bool block_is_off(const json& value) {
  if (value.is_null() || (value.is_boolean() && !value.get<bool>())) return true;
  if (value.is_number() && value.get<double>() <= 1) return true;  // a size of 1: no parallelism
  if (!value.is_object()) return false;
  if (value.empty()) return true;
  if (value.contains("enabled")) return value.at("enabled") == false;
  // activation_checkpointing: off when every feature switch in it is false.
  for (const auto& [key, item] : value.items()) {
    if (item.is_boolean() && item.get<bool>()) return false;
  }
  return value.contains("partition_activations") || value.contains("cpu_checkpointing");
}

void check_top_level(const json& root, std::vector<std::string>& no_effect) {
  static constexpr const char* kRead[] = {"optimizer",
                                          "scheduler",
                                          "fp16",
                                          "bf16",
                                          "bfloat16",
                                          "zero_optimization",
                                          "gradient_clipping",
                                          "gradient_accumulation_steps",
                                          "train_batch_size",
                                          "train_micro_batch_size_per_gpu",
                                          "steps_per_print",
                                          "wall_clock_breakdown",
                                          "data_types",
                                          "spillway"};
  for (const auto& [key, value] : root.items()) {
    bool known = false;
    for (const char* name : kRead) known = known || key == name;
    if (known) continue;
    for (const char* name : kNoEffectKeys) known = known || key == name;
    if (known) {
      no_effect.push_back(key);
      continue;
    }
    for (const Refused& refused : kRefusedBlocks) {
      if (key != refused.key) continue;
      known = true;
      if (!block_is_off(value)) reject(key, refused.why);
    }
    if (known) continue;
    std::string accepted;
    for (const char* name : kRead)
      accepted += fmt::format("{}{}", accepted.empty() ? "" : ", ", name);
    for (const char* name : kNoEffectKeys) accepted += fmt::format(", {}", name);
    for (const Refused& refused : kRefusedBlocks)
      accepted += fmt::format(", {} (off only)", refused.key);
    reject(key, fmt::format("unknown key (accepted here: {})", accepted));
  }
}

// DeepSpeed's _set_batch_related_parameters and _batch_assertion with a world
// size of 1: any one of the three is derived from the other two (integer
// division), then train_batch_size must equal micro batch x accumulation.
// spillway, which builds no data loader, also accepts none of them.
void derive_batch_sizes(const json& root, EngineConfig& config) {
  for (const char* key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
    refuse_auto(root, key, "");
  std::optional<long long> train, micro, accumulation;
  if (root.contains("train_batch_size")) train = integer_at(root, "train_batch_size", "", 1, 1);
  if (root.contains("train_micro_batch_size_per_gpu"))
    micro = integer_at(root, "train_micro_batch_size_per_gpu", "", 1, 1);
  if (root.contains("gradient_accumulation_steps"))
    accumulation = integer_at(root, "gradient_accumulation_steps", "", 1, 1);
  if (train && micro && !accumulation) {
    accumulation = *train / *micro;
  } else if (train && accumulation && !micro) {
    micro = *train / *accumulation;
  } else if (micro && accumulation && !train) {
    train = *micro * *accumulation;
  } else if (train && !micro && !accumulation) {
    accumulation = 1;
    micro = *train;
  } else if (micro && !train && !accumulation) {
    train = *micro;
    accumulation = 1;
  }
  if (train && micro && accumulation &&
      (*micro < 1 || *accumulation < 1 || *train != *micro * *accumulation))
    reject("train_batch_size",
           fmt::format("{} is not train_micro_batch_size_per_gpu ({}) x "
                       "gradient_accumulation_steps ({}) (x world size 1), as DeepSpeed requires",
                       *train, *micro, *accumulation));
  config.train_batch_size = train;
  config.train_micro_batch_size_per_gpu = micro;
  config.gradient_accumulation_steps = static_cast<int>(accumulation.value_or(1));
}

// The spillway block as SPILLWAY_CONF text, checked by the configuration
// parser itself so its messages (key, value, accepted form) reach the user.
std::string spillway_conf(const json& block) {
  std::string text;
  for (const auto& [key, value] : block.items()) {
    std::string item;
    if (value.is_string()) {
      item = value.get<std::string>();
    } else if (value.is_boolean() || value.is_number()) {
      item = value.dump();
    } else {
      reject(join("spillway", key),
             fmt::format("expected a string, number or boolean, got {}", value.dump()));
    }
    if (item.find(',') != std::string::npos)
      reject(join("spillway", key),
             fmt::format("a value may not contain ',', got {}", value.dump()));
    text += fmt::format("{}{}:{}", text.empty() ? "" : ",", key, item);
  }
  const ConfigResult parsed = parse_config(text);
  if (!parsed.ok()) {
    const ConfigError& error = *parsed.error;
    reject(error.key.empty() ? std::string("spillway") : join("spillway", error.key),
           error.message);
  }
  return text;
}

void parse_data_types(const json& root) {
  if (!root.contains("data_types")) return;
  const json& block = object_at(root, "data_types", "");
  check_keys(block, "data_types", {"grad_accum_dtype"});
  if (!block.contains("grad_accum_dtype")) return;
  const json& value = block.at("grad_accum_dtype");
  if (!value.is_null() && value != "fp32" && value != "float32")
    reject("data_types.grad_accum_dtype",
           fmt::format("spillway accumulates gradients in fp32; expected \"fp32\", got {}",
                       value.dump()));
}

}  // namespace

EngineConfig parse_engine_config(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& error) {
    throw std::invalid_argument(fmt::format("engine config: not valid JSON: {}", error.what()));
  }
  if (!root.is_object()) reject("(top level)", "expected a JSON object");
  EngineConfig config;
  check_top_level(root, config.keys_without_effect);

  config.optimizer = parse_optimizer(root);
  config.zero = parse_zero_config(root, config.keys_without_effect);
  const bool fp16 = parse_fp16(root, config.zero, config.loss_scaler);
  const bool bf16 = parse_bf16(root);
  if (fp16 && bf16) reject("bf16.enabled", "fp16 and bf16 cannot both be enabled");
  config.precision = fp16 ? Precision::fp16 : bf16 ? Precision::bf16 : Precision::f32;
  parse_data_types(root);

  refuse_auto(root, "gradient_clipping", "");
  config.gradient_clipping = number_at(root, "gradient_clipping", "", 0, 0);
  derive_batch_sizes(root, config);

  // DeepSpeed 0.18: steps_per_print defaults to None (no step line).
  if (root.contains("steps_per_print") && !root.at("steps_per_print").is_null())
    config.steps_per_print = integer_at(root, "steps_per_print", "", 1, 1);
  config.wall_clock_breakdown = bool_at(root, "wall_clock_breakdown", "", false);

  if (root.contains("scheduler")) config.scheduler = parse_lr_schedule(root.at("scheduler"));
  if (root.contains("spillway"))
    config.spillway_conf = spillway_conf(object_at(root, "spillway", ""));
  return config;
}

const char* to_string(OptimizerType type) {
  switch (type) {
    case OptimizerType::adam:
      return "Adam";
    case OptimizerType::adamw:
      return "AdamW";
    case OptimizerType::sgd:
      return "SGD";
  }
  return "?";
}

std::string describe_deepspeed_mapping(const EngineConfig& config) {
  std::string report;
  const ZeroConfig& zero = config.zero;
  if (zero.stage > 0) {
    static constexpr const char* kSharded[] = {"", "optimizer states",
                                               "optimizer states and gradients",
                                               "optimizer states, gradients and parameters"};
    report += fmt::format(
        "zero_optimization.stage {}: DeepSpeed would shard the {} across data-parallel ranks; "
        "spillway runs one process, so nothing is sharded: it keeps the working set within "
        "the device budget by placing chunks on the GPU or in pinned CPU memory as they are "
        "used\n",
        zero.stage, kSharded[zero.stage]);
  }
  if (zero.offload_optimizer == OffloadDevice::cpu)
    report +=
        "zero_optimization.offload_optimizer.device cpu: DeepSpeed would keep every optimizer "
        "state in CPU memory and step it with DeepSpeedCPUAdam; spillway places optimizer-state "
        "chunks dynamically within the device budget and steps the chunks that are in CPU "
        "memory with its CPU Adam, the others on the GPU\n";
  if (zero.offload_param == OffloadDevice::cpu)
    report +=
        "zero_optimization.offload_param.device cpu: DeepSpeed would keep every parameter in "
        "CPU memory and fetch it for each use; spillway keeps parameter chunks on the GPU while "
        "the device budget allows and spills the rest to pinned CPU memory\n";
  if (!config.keys_without_effect.empty()) {
    std::string keys;
    for (const std::string& key : config.keys_without_effect)
      keys += fmt::format("{}{}", keys.empty() ? "" : ", ", key);
    report += fmt::format(
        "accepted with no effect under spillway (multi-rank communication, bucket and "
        "DeepSpeed-internal tuning): {}\n",
        keys);
  }
  return report;
}

}  // namespace spillway::engine
