// spillway's configuration: one table of options, parsed from a string in the
// syntax of PYTORCH_CUDA_ALLOC_CONF ("key:value,key:value").
//
// The same string comes from the SPILLWAY_CONF environment variable (read once,
// at activation) or from an explicit configure call. Parsing never throws and
// never allocates device memory: it returns a Config or a ConfigError naming
// the key, the value and the accepted form.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tracer/cupti/cupti_mode.h"

namespace spillway {

enum class DeviceChoice { auto_select, cuda, sim };
enum class EvictionPolicyKind { planned, lru, static_residency };
enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };
// Who puts a Python script's models into chunks (docs/python.md, "manage:auto").
enum class ManageMode { automatic, explicit_calls };
// How the torch bridge joins a data-parallel group (docs/data-parallel.md):
// not at all, or from torchrun's environment.
enum class DistMode { off, env };
// Where the parameters other ranks own live between their uses
// (docs/data-parallel.md): on every rank, or gathered for each use and
// dropped after it (Note [Parameters gathered for their use] in
// hooks/torch/sharded_params.cc).
enum class DistParams { replicated, sharded };

// A byte count given either absolutely or as a fraction of some total
// (device memory for device_budget, physical RAM for host_budget).
struct ByteBudget {
  std::size_t bytes = 0;           // used when fraction is unset
  std::optional<double> fraction;  // in (0, 1]

  std::size_t resolve(std::size_t total_bytes) const;
  friend bool operator==(const ByteBudget&, const ByteBudget&) = default;
};

struct Config {
  DeviceChoice device = DeviceChoice::auto_select;
  ByteBudget device_budget{0, 0.9};
  ByteBudget host_budget{0, 0.5};
  std::size_t chunk_size = 64'000'000;
  bool expandable_segments = true;  // Note [Expandable segments] (expandable_segments.cc)
  EvictionPolicyKind policy = EvictionPolicyKind::planned;
  int warmup_steps = 1;
  bool prefetch = true;
  ManageMode manage = ManageMode::automatic;  // acted on by the Python start-up hook only
  DistMode dist = DistMode::off;              // acted on by the torch bridge's manage()
  DistParams dist_params = DistParams::replicated;
  std::string trace;  // empty: write no trace file
  CuptiMode cupti = CuptiMode::auto_select;
  bool strict_residency = false;
  std::size_t sim_capacity = 4'000'000'000;
  double sim_bandwidth = 0;  // bytes per second; 0 = instant
  LogLevel log = LogLevel::warn;

  friend bool operator==(const Config&, const Config&) = default;
};

struct ConfigError {
  std::string key;  // empty when the error is not about one key (e.g. a missing ':')
  std::string value;
  std::string message;  // whole sentence, names key, value and accepted form
};

// Either a Config or the first error found.
struct ConfigResult {
  std::optional<Config> config;
  std::optional<ConfigError> error;
  // Keys the text gave explicitly, in the order given (the rest kept their
  // defaults); lets a report tell "set" from "default".
  std::vector<std::string> explicit_keys;

  bool ok() const { return config.has_value(); }
};

// One row of the option table, for help output and documentation.
struct OptionInfo {
  std::string_view name;
  std::string_view default_value;  // as it would be written in SPILLWAY_CONF
  std::string_view accepted_form;  // e.g. "a size such as 64MB (B, KB, MB, GB, KiB, MiB, GiB)"
  std::string_view help;           // one line
};

// The option table, in documentation order.
const std::vector<OptionInfo>& option_table();

// Parses a configuration string. Empty (or all-whitespace) gives the defaults.
ConfigResult parse_config(std::string_view text);

// Reads SPILLWAY_CONF; unset gives the defaults.
ConfigResult config_from_environment();

// The effective configuration written back in SPILLWAY_CONF syntax, one
// "key:value" per option, in table order; parse_config of it gives it back.
std::string format_config(const Config& config);

// One option's value as format_config writes it (e.g. "64000000B" for
// chunk_size); empty for a key that is not in the table.
std::string format_option_value(const Config& config, std::string_view key);

std::string_view to_string(DeviceChoice);
std::string_view to_string(EvictionPolicyKind);
std::string_view to_string(CuptiMode);
std::string_view to_string(LogLevel);
std::string_view to_string(ManageMode);
std::string_view to_string(DistMode);
std::string_view to_string(DistParams);

}  // namespace spillway
