// ZeroConfig: DeepSpeed's zero_optimization block, read with DeepSpeed 0.18's
// meaning and mapped onto what spillway does instead.
//
// ZeRO shards optimizer states (stage 1), gradients (2) and parameters (3)
// across data-parallel ranks, and can offload optimizer states and parameters
// to the CPU or NVMe. spillway runs one process: nothing is sharded, and
// instead of a fixed offload it places every chunk dynamically within the
// device budget (pinned CPU memory for what does not fit), stepping the
// chunks on the CPU with its CPU Adam. So the stage and the CPU offloads are
// read and reported (describe_deepspeed_mapping), the communication and
// bucket tuning keys are accepted with no effect (any value, "auto"
// included), and NVMe offload and ZeRO++ quantization are refused by name.
// docs/deepspeed.md lists every key and its decision.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spillway::engine {

enum class OffloadDevice { none, cpu };

struct ZeroConfig {
  int stage = 0;  // what DeepSpeed would shard across ranks; one process shards nothing
  OffloadDevice offload_optimizer = OffloadDevice::none;
  OffloadDevice offload_param = OffloadDevice::none;
};

// Reads root["zero_optimization"] (absent: stage 0). Appends the path of each
// key accepted without effect to `no_effect`. Throws std::invalid_argument
// naming a refused or malformed key.
ZeroConfig parse_zero_config(const nlohmann::json& root, std::vector<std::string>& no_effect);

const char* to_string(OffloadDevice device);

}  // namespace spillway::engine
