#include "hooks/engine/zero_config.h"

#include <string>

#include <fmt/format.h>

#include "hooks/engine/json_fields.h"

namespace spillway::engine {
namespace {

using nlohmann::json;

constexpr const char* kNvmeAlternative =
    "spillway does not offload to NVMe; it spills chunks to pinned CPU memory within the "
    "device budget instead: use \"device\": \"cpu\" (or \"none\")";

// Multi-rank communication, bucketing and stage-3 prefetch tuning: with one
// process and dynamic chunk placement none of them changes what spillway does.
constexpr const char* kNoEffectKeys[] = {"contiguous_gradients",
                                         "overlap_comm",
                                         "reduce_scatter",
                                         "reduce_bucket_size",
                                         "use_multi_rank_bucket_allreduce",
                                         "allgather_partitions",
                                         "allgather_bucket_size",
                                         "load_from_fp32_weights",
                                         "elastic_checkpoint",
                                         "sub_group_size",
                                         "prefetch_bucket_size",
                                         "stage3_prefetch_bucket_size",
                                         "param_persistence_threshold",
                                         "stage3_param_persistence_threshold",
                                         "model_persistence_threshold",
                                         "stage3_model_persistence_threshold",
                                         "max_live_parameters",
                                         "stage3_max_live_parameters",
                                         "max_reuse_distance",
                                         "stage3_max_reuse_distance",
                                         "gather_16bit_weights_on_model_save",
                                         "stage3_gather_16bit_weights_on_model_save",
                                         "stage3_gather_fp16_weights_on_model_save",
                                         "module_granularity_threshold",
                                         "stage3_module_granularity_threshold",
                                         "use_all_reduce_for_fetch_params",
                                         "stage3_use_all_reduce_for_fetch_params",
                                         "allgather_sequential",
                                         "stage3_allgather_sequential",
                                         "ignore_unused_parameters",
                                         "legacy_stage1",
                                         "round_robin_gradients",
                                         "zero_hpz_partition_size",
                                         "mics_shard_size",
                                         "mics_hierarchical_params_gather",
                                         "memory_efficient_linear",
                                         "pipeline_loading_checkpoint",
                                         "override_module_apply",
                                         "log_trace_cache_warnings",
                                         "enable_sanity_checks",
                                         "save_muon_momentum_buffer_in_memory",
                                         "leaf_module",
                                         "cpu_offload_use_pin_memory"};

// ZeRO++ and ZenFlow: features spillway lacks; refused unless off.
constexpr const char* kRefusedWhenOn[] = {
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "zeropp_loco_param", "zenflow"};

bool is_off(const json& value) {
  return value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
         (value.is_object() && value.empty());
}

OffloadDevice offload_device(const json& block, const std::string& path) {
  if (!block.contains("device")) return OffloadDevice::none;
  const json& value = block.at("device");
  const std::string where = join(path, "device");
  if (value == "cpu") return OffloadDevice::cpu;
  if (value == "none" || value.is_null()) return OffloadDevice::none;
  if (value == "nvme") reject(where, kNvmeAlternative);
  reject(where, fmt::format("expected \"cpu\" or \"none\", got {}", value.dump()));
}

OffloadDevice parse_offload(const json& zero, const char* key, bool optimizer,
                            std::vector<std::string>& no_effect) {
  const std::string path = join("zero_optimization", key);
  if (zero.at(key).is_null()) return OffloadDevice::none;
  const json& raw = object_at(zero, key, "zero_optimization");
  const json block = without_auto(raw);
  if (optimizer) {
    check_keys(raw, path,
               {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                "pipeline_write", "fast_init", "ratio", "super_offload", "cpuadam_cores_perc"});
  } else {
    check_keys(raw, path,
               {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"});
  }
  const OffloadDevice device = offload_device(block, path);
  for (const char* nvme_key : {"nvme_path", "pipeline_read", "pipeline_write"}) {
    if (block.contains(nvme_key) && !is_off(block.at(nvme_key)))
      reject(join(path, nvme_key), kNvmeAlternative);
  }
  if (block.contains("super_offload") && !is_off(block.at("super_offload")))
    reject(join(path, "super_offload"),
           "spillway has no SuperOffload; it steps the chunks on the CPU with its CPU Adam "
           "whatever their share");
  for (const auto& [name, value] : raw.items()) {
    if (name != "device" && name != "nvme_path" && name != "pipeline_read" &&
        name != "pipeline_write" && name != "super_offload")
      no_effect.push_back(join(path, name));
  }
  return device;
}

}  // namespace

ZeroConfig parse_zero_config(const json& root, std::vector<std::string>& no_effect) {
  ZeroConfig config;
  if (!root.contains("zero_optimization")) return config;
  const json& zero = object_at(root, "zero_optimization", "");
  const std::string path = "zero_optimization";
  for (const auto& [key, value] : zero.items()) {
    if (value == "auto" &&
        (key == "stage" || key == "offload_optimizer" || key == "offload_param" ||
         key == "cpu_offload" || key == "cpu_offload_param"))
      continue;  // DeepSpeed drops "auto": the default
    if (key == "stage") {
      config.stage = static_cast<int>(integer_at(zero, "stage", path, 0, 0));
      if (config.stage > 3)
        reject(join(path, "stage"), fmt::format("expected 0, 1, 2 or 3, got {}", value.dump()));
    } else if (key == "offload_optimizer") {
      config.offload_optimizer = parse_offload(zero, "offload_optimizer", true, no_effect);
    } else if (key == "offload_param") {
      config.offload_param = parse_offload(zero, "offload_param", false, no_effect);
    } else if (key == "cpu_offload" || key == "cpu_offload_param") {
      // DeepSpeed's deprecated spellings of the two offloads to the CPU.
      const bool on = bool_at(zero, key.c_str(), path, false);
      if (on && key == "cpu_offload") config.offload_optimizer = OffloadDevice::cpu;
      if (on && key == "cpu_offload_param") config.offload_param = OffloadDevice::cpu;
    } else {
      bool known = false;
      for (const char* name : kNoEffectKeys) known = known || key == name;
      if (known) {
        no_effect.push_back(join(path, key));
        continue;
      }
      for (const char* name : kRefusedWhenOn) {
        if (key == name && !is_off(value) && value != "auto")
          reject(join(path, key),
                 "ZeRO++ quantized communication and ZenFlow are not in spillway (one process "
                 "communicates nothing); remove the key or set it false");
        known = known || key == name;
      }
      if (!known) {
        std::string accepted =
            "stage, offload_optimizer, offload_param, cpu_offload, "
            "cpu_offload_param";
        for (const char* name : kNoEffectKeys) accepted += fmt::format(", {}", name);
        for (const char* name : kRefusedWhenOn) accepted += fmt::format(", {}", name);
        reject(join(path, key), fmt::format("unknown key (accepted here: {})", accepted));
      }
    }
  }
  return config;
}

const char* to_string(OffloadDevice device) {
  return device == OffloadDevice::cpu ? "cpu" : "none";
}

}  // namespace spillway::engine
