// SPILLWAY_CONF: the item syntax and its error sentences.
//
// A configuration string is "key:value,key:value" (PYTORCH_CUDA_ALLOC_CONF's
// syntax). Items are split at ',' and each at its first ':', so a value may
// itself hold ':' (a trace path) but never ','. Whitespace around keys and
// values is dropped and empty items are skipped. What one value means belongs
// to the option table (options.cc); this file only finds the items, looks up
// their rows and reports the first problem as one sentence naming the key,
// the value and the accepted form.
//
// parse_config must never throw or crash on any input: it is fed raw
// environment text before anything is allocated.
#include "allocator/config/config.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <exception>

#include "allocator/config/options.h"

namespace spillway {
namespace {

std::string known_keys() {
  std::string keys;
  for (const detail::OptionRow& row : detail::option_rows()) {
    if (!keys.empty()) keys += ", ";
    keys += row.info.name;
  }
  return keys;
}

ConfigResult failure(std::string key, std::string value, std::string message) {
  ConfigResult result;
  result.error = ConfigError{std::move(key), std::move(value), std::move(message)};
  return result;
}

ConfigResult parse_items(std::string_view text) {
  Config config;
  std::vector<std::string> explicit_keys;
  // The value each row was given, to name both in a duplicate-key error.
  std::vector<std::optional<std::string>> given(detail::option_rows().size());

  while (!text.empty()) {
    std::size_t comma = text.find(',');
    std::string_view item = detail::trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;  // "a:1,,b:2" and a trailing ',' are harmless

    std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return failure("", std::string(item),
                     fmt::format("SPILLWAY_CONF: missing ':' in item '{}': expected key:value "
                                 "items separated by ',' such as chunk_size:64MB",
                                 item));
    }
    std::string_view key = detail::trim(item.substr(0, colon));
    std::string_view value = detail::trim(item.substr(colon + 1));
    if (key.empty()) {
      return failure("", std::string(value),
                     fmt::format("SPILLWAY_CONF: missing key before ':' in item '{}': expected "
                                 "key:value with a key among {}",
                                 item, known_keys()));
    }

    const detail::OptionRow* row = detail::find_option(key);
    if (row == nullptr) {
      return failure(
          std::string(key), std::string(value),
          fmt::format("SPILLWAY_CONF: unknown key '{}' (known keys: {})", key, known_keys()));
    }
    auto& first_value = given[static_cast<std::size_t>(row - detail::option_rows().data())];
    if (first_value) {
      return failure(std::string(key), std::string(value),
                     fmt::format("SPILLWAY_CONF: duplicate key '{}' with value '{}' (first given "
                                 "as '{}'): each key may appear once",
                                 key, value, *first_value));
    }
    if (!row->parse(value, config)) {
      return failure(std::string(key), std::string(value),
                     fmt::format("SPILLWAY_CONF: bad value '{}' for '{}': expected {}", value, key,
                                 row->info.accepted_form));
    }
    first_value = std::string(value);
    explicit_keys.emplace_back(key);
  }

  ConfigResult result;
  result.config = std::move(config);
  result.explicit_keys = std::move(explicit_keys);
  return result;
}

}  // namespace

std::size_t ByteBudget::resolve(std::size_t total_bytes) const {
  if (!fraction) return bytes;
  // In double, as the user would compute it: 0.3 of 10 bytes is 3, not the 2
  // that the exact binary value of 0.3 (0.29999...) would give. Clamped since
  // a total above 2^53 may round up on conversion.
  double share = std::floor(*fraction * static_cast<double>(total_bytes));
  if (!(share > 0)) return 0;
  if (share >= static_cast<double>(total_bytes)) return total_bytes;
  return static_cast<std::size_t>(share);
}

ConfigResult parse_config(std::string_view text) {
  try {
    return parse_items(text);
  } catch (const std::exception& e) {
    // Only allocation can fail here; report it rather than unwinding into the
    // activation path.
    return failure("", "", fmt::format("SPILLWAY_CONF: could not be parsed: {}", e.what()));
  }
}

ConfigResult config_from_environment() {
  const char* text = std::getenv("SPILLWAY_CONF");
  return parse_config(text == nullptr ? std::string_view() : std::string_view(text));
}

std::string format_config(const Config& config) {
  std::string text;
  for (const detail::OptionRow& row : detail::option_rows()) {
    if (!text.empty()) text += ',';
    text += row.info.name;
    text += ':';
    text += row.format(config);
  }
  return text;
}

std::string format_option_value(const Config& config, std::string_view key) {
  const detail::OptionRow* row = detail::find_option(key);
  return row == nullptr ? std::string() : row->format(config);
}

const std::vector<OptionInfo>& option_table() {
  static const std::vector<OptionInfo> table = [] {
    std::vector<OptionInfo> infos;
    for (const detail::OptionRow& row : detail::option_rows()) infos.push_back(row.info);
    return infos;
  }();
  return table;
}

}  // namespace spillway
