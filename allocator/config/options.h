// The option table behind SPILLWAY_CONF (internal to spillway_core).
//
// Each row holds a key's documentation together with the two functions that
// read and write its value, so a key's grammar, its default and its help line
// live in one place and cannot drift apart. config.cc owns the item syntax
// ("key:value,key:value") and the error sentences; this table owns what a
// single value means.
//
// The value grammars (sizes, fractions, rates, booleans) are declared here too
// so tests can probe them directly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "allocator/config/config.h"

namespace spillway::detail {

struct OptionRow {
  OptionInfo info;
  // Stores a trimmed value into `config`; false when it is not of info.accepted_form
  // (config is then left unchanged).
  bool (*parse)(std::string_view value, Config& config);
  // The value as written in SPILLWAY_CONF; `parse` of it restores the same value.
  std::string (*format)(const Config& config);
};

std::span<const OptionRow> option_rows();
const OptionRow* find_option(std::string_view name);  // nullptr when unknown

// The largest byte count a size may denote: sizes stay representable as int64.
inline constexpr std::uint64_t kMaxSizeBytes = (std::uint64_t{1} << 63) - 1;

// "64MB", "1.5 GiB", "4096": a non-negative decimal number, optional
// whitespace, an optional unit (B, KB, MB, GB, TB = powers of 1000; KiB, MiB,
// GiB, TiB = powers of 1024; any case). Rounds down to whole bytes.
std::optional<std::uint64_t> parse_size(std::string_view text);

// A plain number in (0, 1] ("0.9", "1", "5e-1"): a share of some total.
std::optional<double> parse_fraction(std::string_view text);

// "instant" or "0" (unmodelled, returned as 0), or a size per second such as
// "25GB/s" ("/s" optional). At least 1 byte per second.
std::optional<double> parse_rate(std::string_view text);

// true|false|1|0|on|off|yes|no, any case.
std::optional<bool> parse_bool(std::string_view text);

std::string_view trim(std::string_view text);  // drops ASCII whitespace at both ends

}  // namespace spillway::detail
