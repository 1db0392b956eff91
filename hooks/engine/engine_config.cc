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

OptimizerType optimizer_type(const json& value) {
  if (!value.is_string())
    reject("optimizer.type", fmt::format("expected a string, got {}", value.dump()));
  std::string name = value.get<std::string>();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (name == "adam") return OptimizerType::adam;
  if (name == "adamw") return OptimizerType::adamw;
  if (name == "sgd") return OptimizerType::sgd;
  reject("optimizer.type", fmt::format("expected Adam, AdamW or SGD, got {}", value.dump()));
}

OptimizerConfig parse_optimizer(const json& root) {
  if (!root.contains("optimizer")) reject("optimizer", "required (an object with type and params)");
  const json& block = object_at(root, "optimizer", "");
  check_keys(block, "optimizer", {"type", "params"});
  if (!block.contains("type")) reject("optimizer.type", "required (Adam, AdamW or SGD)");
  OptimizerConfig config;
  config.type = optimizer_type(block.at("type"));
  const json no_params = json::object();
  const json& params =
      block.contains("params") ? object_at(block, "params", "optimizer") : no_params;
  const std::string path = "optimizer.params";
  if (config.type == OptimizerType::sgd) {
    check_keys(params, path, {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
    config.lr = number_at(params, "lr", path, 1e-3, 0);
    config.momentum = number_at(params, "momentum", path, 0, 0);
    config.dampening = number_at(params, "dampening", path, 0, 0);
    config.weight_decay = number_at(params, "weight_decay", path, 0, 0);
    config.nesterov = bool_at(params, "nesterov", path, false);
    if (config.nesterov && (config.momentum <= 0 || config.dampening != 0))
      reject(join(path, "nesterov"), "needs momentum > 0 and dampening 0");
    return config;
  }
  if (config.type == OptimizerType::adam) {
    check_keys(params, path, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"});
    // DeepSpeed's Adam decouples weight decay unless adam_w_mode is false.
    if (bool_at(params, "adam_w_mode", path, true)) config.type = OptimizerType::adamw;
  } else {
    check_keys(params, path, {"lr", "betas", "eps", "weight_decay"});
  }
  config.lr = number_at(params, "lr", path, config.lr, 0);
  config.eps = number_at(params, "eps", path, config.eps, 0);
  config.weight_decay = number_at(params, "weight_decay", path, config.weight_decay, 0);
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

}  // namespace

EngineConfig parse_engine_config(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& error) {
    throw std::invalid_argument(fmt::format("engine config: not valid JSON: {}", error.what()));
  }
  if (!root.is_object()) reject("(top level)", "expected a JSON object");
  check_keys(root, "",
             {"optimizer", "fp16", "bf16", "gradient_clipping", "gradient_accumulation_steps",
              "train_batch_size", "train_micro_batch_size_per_gpu", "scheduler", "spillway"});

  EngineConfig config;
  config.optimizer = parse_optimizer(root);

  bool fp16 = false;
  if (root.contains("fp16")) {
    const json& block = object_at(root, "fp16", "");
    check_keys(block, "fp16",
               {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                "min_loss_scale"});
    fp16 = bool_at(block, "enabled", "fp16", false);
    LossScalerOptions& scaler = config.loss_scaler;
    scaler.static_scale = number_at(block, "loss_scale", "fp16", 0, 0);
    scaler.initial_scale_power =
        static_cast<int>(integer_at(block, "initial_scale_power", "fp16", 16, 0));
    if (scaler.initial_scale_power > 64) reject("fp16.initial_scale_power", "expected at most 64");
    scaler.window = static_cast<int>(integer_at(block, "loss_scale_window", "fp16", 1000, 1));
    scaler.hysteresis = static_cast<int>(integer_at(block, "hysteresis", "fp16", 2, 1));
    scaler.min_scale = number_at(block, "min_loss_scale", "fp16", 1, 0, /*min_exclusive=*/true);
  }
  bool bf16 = false;
  if (root.contains("bf16")) {
    const json& block = object_at(root, "bf16", "");
    check_keys(block, "bf16", {"enabled"});
    bf16 = bool_at(block, "enabled", "bf16", false);
  }
  if (fp16 && bf16) reject("bf16.enabled", "fp16 and bf16 cannot both be enabled");
  config.precision = fp16 ? Precision::fp16 : bf16 ? Precision::bf16 : Precision::f32;

  config.gradient_clipping = number_at(root, "gradient_clipping", "", 0, 0);
  config.gradient_accumulation_steps =
      static_cast<int>(integer_at(root, "gradient_accumulation_steps", "", 1, 1));
  if (root.contains("train_batch_size"))
    config.train_batch_size = integer_at(root, "train_batch_size", "", 1, 1);
  if (root.contains("train_micro_batch_size_per_gpu"))
    config.train_micro_batch_size_per_gpu =
        integer_at(root, "train_micro_batch_size_per_gpu", "", 1, 1);
  // One process, one device: the global batch is micro-batch x accumulation.
  if (config.train_batch_size && config.train_micro_batch_size_per_gpu &&
      *config.train_batch_size !=
          *config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps)
    reject("train_batch_size",
           fmt::format("{} is not train_micro_batch_size_per_gpu ({}) x "
                       "gradient_accumulation_steps ({})",
                       *config.train_batch_size, *config.train_micro_batch_size_per_gpu,
                       config.gradient_accumulation_steps));

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

}  // namespace spillway::engine
