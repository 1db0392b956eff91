// The SPILLWAY_CONF option table and the value grammars it uses.
//
// One row per key (see options.h): name, default, accepted form, help line,
// and the parse/format pair for its value. Formatting writes exact values
// (byte counts as integers with a "B", fractions and rates in fmt's shortest
// round-trip form), so parse_config(format_config(c)) == c.
//
// The enum spellings live here once: the parsers read them and to_string
// writes them.
//
// Number parsing uses std::from_chars and hand-checked integer arithmetic: no
// exceptions, no locale, no overflow.
#include "allocator/config/options.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <system_error>

namespace spillway::detail {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!is_digit(c)) return false;
  }
  return true;
}

struct SizeUnit {
  std::string_view name;
  std::uint64_t bytes;
};
constexpr std::array<SizeUnit, 9> kSizeUnits{{
    {"B", 1},
    {"KB", 1'000},
    {"MB", 1'000'000},
    {"GB", 1'000'000'000},
    {"TB", 1'000'000'000'000},
    {"KiB", std::uint64_t{1} << 10},
    {"MiB", std::uint64_t{1} << 20},
    {"GiB", std::uint64_t{1} << 30},
    {"TiB", std::uint64_t{1} << 40},
}};

// Bytes per unit; no unit means bytes.
std::optional<std::uint64_t> unit_bytes(std::string_view unit) {
  if (unit.empty()) return 1;
  for (const SizeUnit& candidate : kSizeUnits) {
    if (iequals(unit, candidate.name)) return candidate.bytes;
  }
  return std::nullopt;
}

// A whole-text double, as from_chars reads it (no sign check, no range check).
std::optional<double> parse_double(std::string_view text) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

template <typename Enum, std::size_t N>
std::optional<Enum> parse_enum(std::string_view text,
                               const std::array<std::pair<std::string_view, Enum>, N>& names) {
  for (const auto& [name, value] : names) {
    if (iequals(text, name)) return value;
  }
  return std::nullopt;
}

constexpr std::array<std::pair<std::string_view, DeviceChoice>, 3> kDeviceNames{{
    {"auto", DeviceChoice::auto_select},
    {"cuda", DeviceChoice::cuda},
    {"sim", DeviceChoice::sim},
}};
constexpr std::array<std::pair<std::string_view, EvictionPolicyKind>, 3> kPolicyNames{{
    {"planned", EvictionPolicyKind::planned},
    {"lru", EvictionPolicyKind::lru},
    {"static", EvictionPolicyKind::static_residency},
}};
constexpr std::array<std::pair<std::string_view, CuptiMode>, 3> kCuptiNames{{
    {"auto", CuptiMode::auto_select},
    {"on", CuptiMode::on},
    {"off", CuptiMode::off},
}};
constexpr std::array<std::pair<std::string_view, ManageMode>, 2> kManageNames{{
    {"auto", ManageMode::automatic},
    {"explicit", ManageMode::explicit_calls},
}};
constexpr std::array<std::pair<std::string_view, DistMode>, 2> kDistNames{{
    {"off", DistMode::off},
    {"env", DistMode::env},
}};
constexpr std::array<std::pair<std::string_view, DistParams>, 2> kDistParamsNames{{
    {"replicated", DistParams::replicated},
    {"sharded", DistParams::sharded},
}};
constexpr std::array<std::pair<std::string_view, LogLevel>, 4> kLogNames{{
    {"error", LogLevel::error},
    {"warn", LogLevel::warn},
    {"info", LogLevel::info},
    {"debug", LogLevel::debug},
}};

template <typename Enum, std::size_t N>
std::string_view enum_name(Enum value,
                           const std::array<std::pair<std::string_view, Enum>, N>& names) {
  for (const auto& [name, candidate] : names) {
    if (candidate == value) return name;
  }
  return "unknown";  // only for a value cast from outside the enum
}

// A budget is either a share of a total or a byte count. A plain number no
// larger than 1 is a share ("1" is all of it: a 1-byte budget is never meant);
// any other plain number must be a whole byte count.
std::optional<ByteBudget> parse_budget(std::string_view text) {
  text = trim(text);
  if (auto fraction = parse_fraction(text)) return ByteBudget{0, *fraction};
  if (parse_double(text) && !all_digits(text)) return std::nullopt;  // e.g. 1.5, 1e3, -1
  if (auto bytes = parse_size(text)) return ByteBudget{static_cast<std::size_t>(*bytes), {}};
  return std::nullopt;
}

// A byte count always carries its "B": a bare "1" would read back as a fraction.
std::string format_size(std::uint64_t bytes) { return fmt::format("{}B", bytes); }

std::string format_budget(const ByteBudget& budget) {
  return budget.fraction ? fmt::format("{}", *budget.fraction) : format_size(budget.bytes);
}

std::string_view format_bool(bool value) { return value ? "true" : "false"; }

// A chunk must be more than the allocator's small-request limit (1 MiB), so
// that its device copy is one whole large-pool slab that a spill returns.
constexpr std::uint64_t kMinChunkSize = std::uint64_t{2} << 20;
constexpr std::uint64_t kMaxChunkSize = std::uint64_t{1} << 40;
constexpr int kMaxWarmupSteps = 1000;

#define SPILLWAY_SIZE_UNITS "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
#define SPILLWAY_BOOL_FORM "a boolean (true, false, 1, 0, on, off, yes, no)"

// The table. Rows are in documentation order; docs/configuration.md mirrors it.
const std::array<OptionRow, 17> kOptionRows{{
    {{"device", "auto", "auto, cuda or sim",
      "device backend; auto picks cuda when a GPU is usable, else sim with a warning"},
     [](std::string_view value, Config& config) {
       auto choice = parse_enum(value, kDeviceNames);
       if (choice) config.device = *choice;
       return choice.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.device)); }},

    {{"device_budget", "0.9",
      "a size such as 40GB " SPILLWAY_SIZE_UNITS
      " or a fraction of device memory in (0, 1] such as 0.9",
      "device memory spillway may hold"},
     [](std::string_view value, Config& config) {
       auto budget = parse_budget(value);
       if (budget) config.device_budget = *budget;
       return budget.has_value();
     },
     [](const Config& config) { return format_budget(config.device_budget); }},

    {{"host_budget", "0.5",
      "a size such as 16GB " SPILLWAY_SIZE_UNITS
      " or a fraction of physical RAM in (0, 1] such as 0.5",
      "cap on pinned host memory for spilled chunks"},
     [](std::string_view value, Config& config) {
       auto budget = parse_budget(value);
       if (budget) config.host_budget = *budget;
       return budget.has_value();
     },
     [](const Config& config) { return format_budget(config.host_budget); }},

    {{"chunk_size", "64MB", "a size from 2MiB to 1TiB such as 64MB " SPILLWAY_SIZE_UNITS,
      "capacity of one chunk, the unit of placement and movement"},
     [](std::string_view value, Config& config) {
       auto bytes = parse_size(value);
       if (!bytes || *bytes < kMinChunkSize || *bytes > kMaxChunkSize) return false;
       config.chunk_size = static_cast<std::size_t>(*bytes);
       return true;
     },
     [](const Config& config) { return format_size(config.chunk_size); }},

    {{"expandable_segments", "true", SPILLWAY_BOOL_FORM,
      "mid-size blocks come from a segment per stream that grows and shrinks in place "
      "(virtual memory), larger ones from segments of their own"},
     [](std::string_view value, Config& config) {
       auto enabled = parse_bool(value);
       if (enabled) config.expandable_segments = *enabled;
       return enabled.has_value();
     },
     [](const Config& config) { return std::string(format_bool(config.expandable_segments)); }},

    {{"policy", "planned", "planned, lru or static",
      "eviction policy; static never spills, so going over budget is an error"},
     [](std::string_view value, Config& config) {
       auto policy = parse_enum(value, kPolicyNames);
       if (policy) config.policy = *policy;
       return policy.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.policy)); }},

    {{"warmup_steps", "1", "an integer from 0 to 1000", "steps traced before planning"},
     [](std::string_view value, Config& config) {
       if (!all_digits(value)) return false;  // from_chars alone would take "-1"
       int steps = 0;
       auto [stop, error] = std::from_chars(value.data(), value.data() + value.size(), steps);
       if (error != std::errc() || steps > kMaxWarmupSteps) return false;
       config.warmup_steps = steps;
       return true;
     },
     [](const Config& config) { return fmt::format("{}", config.warmup_steps); }},

    {{"prefetch", "true", SPILLWAY_BOOL_FORM, "move chunks to the device ahead of their use"},
     [](std::string_view value, Config& config) {
       auto enabled = parse_bool(value);
       if (enabled) config.prefetch = *enabled;
       return enabled.has_value();
     },
     [](const Config& config) { return std::string(format_bool(config.prefetch)); }},

    {{"manage", "auto", "auto or explicit",
      "auto: a Python script started with SPILLWAY_CONF has its models put into chunks "
      "without calling spillway.manage"},
     [](std::string_view value, Config& config) {
       auto mode = parse_enum(value, kManageNames);
       if (mode) config.manage = *mode;
       return mode.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.manage)); }},

    {{"dist", "off", "off or env",
      "env: train data parallel in the group torchrun's environment describes (RANK, "
      "WORLD_SIZE, MASTER_ADDR, MASTER_PORT), joined at the first manage"},
     [](std::string_view value, Config& config) {
       auto mode = parse_enum(value, kDistNames);
       if (mode) config.dist = *mode;
       return mode.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.dist)); }},

    {{"dist_params", "replicated", "replicated or sharded",
      "sharded: each rank keeps the parameters it owns and gathers the others' for each use "
      "(every rank must use the same parameters in the same order); replicated: every rank "
      "keeps them all"},
     [](std::string_view value, Config& config) {
       auto mode = parse_enum(value, kDistParamsNames);
       if (mode) config.dist_params = *mode;
       return mode.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.dist_params)); }},

    {{"trace", "", "a file path without ',' (empty: no trace)", "path of the trace file to write"},
     [](std::string_view value, Config& config) {
       config.trace = std::string(value);  // the item syntax already stopped it at ','
       return true;
     },
     [](const Config& config) { return config.trace; }},

    {{"cupti", "auto", "auto, on or off",
      "use CUPTI to observe kernels; auto uses it where it is available"},
     [](std::string_view value, Config& config) {
       auto mode = parse_enum(value, kCuptiNames);
       if (mode) config.cupti = *mode;
       return mode.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.cupti)); }},

    {{"strict_residency", "false", SPILLWAY_BOOL_FORM,
      "evicted chunks point at inaccessible memory, so a missed fetch faults"},
     [](std::string_view value, Config& config) {
       auto strict = parse_bool(value);
       if (strict) config.strict_residency = *strict;
       return strict.has_value();
     },
     [](const Config& config) { return std::string(format_bool(config.strict_residency)); }},

    {{"sim_capacity", "4GB", "a size such as 4GB " SPILLWAY_SIZE_UNITS,
      "memory of the simulated device"},
     [](std::string_view value, Config& config) {
       auto bytes = parse_size(value);
       if (bytes) config.sim_capacity = static_cast<std::size_t>(*bytes);
       return bytes.has_value();
     },
     [](const Config& config) { return format_size(config.sim_capacity); }},

    {{"sim_bandwidth", "instant",
      "instant, 0, or a rate of at least 1B/s such as 25GB/s " SPILLWAY_SIZE_UNITS,
      "copy speed of the simulated device; instant models none"},
     [](std::string_view value, Config& config) {
       auto rate = parse_rate(value);
       if (rate) config.sim_bandwidth = *rate;
       return rate.has_value();
     },
     [](const Config& config) {
       return config.sim_bandwidth == 0 ? std::string("instant")
                                        : fmt::format("{}B/s", config.sim_bandwidth);
     }},

    {{"log", "warn", "error, warn, info or debug", "lowest level of messages written to stderr"},
     [](std::string_view value, Config& config) {
       auto level = parse_enum(value, kLogNames);
       if (level) config.log = *level;
       return level.has_value();
     },
     [](const Config& config) { return std::string(to_string(config.log)); }},
}};

#undef SPILLWAY_SIZE_UNITS
#undef SPILLWAY_BOOL_FORM

}  // namespace

std::span<const OptionRow> option_rows() { return kOptionRows; }

const OptionRow* find_option(std::string_view name) {
  for (const OptionRow& row : kOptionRows) {
    if (row.info.name == name) return &row;
  }
  return nullptr;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
  text = trim(text);
  std::size_t position = 0;
  auto skip_digits = [&] {
    std::size_t start = position;
    while (position < text.size() && is_digit(text[position])) ++position;
    return text.substr(start, position - start);
  };
  std::string_view whole_digits = skip_digits();
  if (whole_digits.empty()) return std::nullopt;  // also rejects signs, "inf", "nan"
  std::string_view fraction_digits;
  if (position < text.size() && text[position] == '.') {
    ++position;
    fraction_digits = skip_digits();
    if (fraction_digits.empty()) return std::nullopt;
  }
  auto unit = unit_bytes(trim(text.substr(position)));
  if (!unit) return std::nullopt;

  // 128-bit so that (a value below 2^63) * (a unit up to 2^40) cannot wrap.
  unsigned __int128 bytes = 0;
  for (char digit : whole_digits) {
    bytes = bytes * 10 + static_cast<unsigned>(digit - '0');
    if (bytes > kMaxSizeBytes) return std::nullopt;
  }
  bytes *= *unit;
  // floor(0.d1...dn * unit), exactly: Horner's rule from the last digit, with
  // a floor division at each step (nested floors of integer divisions equal
  // one floor of the whole), so "0.000000000000000000001TiB" is exact too.
  std::uint64_t fraction_bytes = 0;
  for (auto digit = fraction_digits.rbegin(); digit != fraction_digits.rend(); ++digit) {
    fraction_bytes = (static_cast<std::uint64_t>(*digit - '0') * *unit + fraction_bytes) / 10;
  }
  bytes += fraction_bytes;
  if (bytes > kMaxSizeBytes) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

std::optional<double> parse_fraction(std::string_view text) {
  auto value = parse_double(trim(text));
  // The comparisons are false for NaN, so it is rejected too.
  if (!value || !(*value > 0.0 && *value <= 1.0)) return std::nullopt;
  return value;
}

std::optional<double> parse_rate(std::string_view text) {
  text = trim(text);
  if (iequals(text, "instant")) return 0.0;
  if (text.size() >= 2 && text[text.size() - 2] == '/' && ascii_lower(text.back()) == 's') {
    text = trim(text.substr(0, text.size() - 2));
  }
  // A leading digit keeps out signs, "inf" and "nan", which from_chars would take.
  if (text.empty() || !is_digit(text.front())) return std::nullopt;
  double number = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, number);
  if (error != std::errc()) return std::nullopt;
  auto unit = unit_bytes(trim(std::string_view(stop, static_cast<std::size_t>(end - stop))));
  if (!unit) return std::nullopt;
  double rate = number * static_cast<double>(*unit);
  // Below one byte per second is a typo, and would not survive formatting as a
  // subnormal; 0 is the documented spelling of "instant".
  if (!std::isfinite(rate) || (rate != 0.0 && rate < 1.0)) return std::nullopt;
  return rate;
}

std::optional<bool> parse_bool(std::string_view text) {
  text = trim(text);
  for (std::string_view yes : {"true", "1", "on", "yes"}) {
    if (iequals(text, yes)) return true;
  }
  for (std::string_view no : {"false", "0", "off", "no"}) {
    if (iequals(text, no)) return false;
  }
  return std::nullopt;
}

}  // namespace spillway::detail

namespace spillway {

// The enum names come from the same lists the parsers read, so they cannot disagree.
std::string_view to_string(DeviceChoice choice) {
  return detail::enum_name(choice, detail::kDeviceNames);
}
std::string_view to_string(EvictionPolicyKind policy) {
  return detail::enum_name(policy, detail::kPolicyNames);
}
std::string_view to_string(CuptiMode mode) { return detail::enum_name(mode, detail::kCuptiNames); }
std::string_view to_string(LogLevel level) { return detail::enum_name(level, detail::kLogNames); }
std::string_view to_string(DistMode mode) { return detail::enum_name(mode, detail::kDistNames); }
std::string_view to_string(DistParams mode) {
  return detail::enum_name(mode, detail::kDistParamsNames);
}
std::string_view to_string(ManageMode mode) {
  return detail::enum_name(mode, detail::kManageNames);
}

}  // namespace spillway
