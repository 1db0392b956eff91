#include "hooks/engine/json_fields.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace spillway::engine {

using nlohmann::json;

[[noreturn]] void reject(const std::string& path, const std::string& what) {
  throw std::invalid_argument(fmt::format("engine config: {}: {}", path, what));
}

std::string join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

void check_keys(const json& object, const std::string& path,
                std::initializer_list<const char*> known) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (const char* name : known) found = found || key == name;
    if (!found) {
      std::string accepted;
      for (const char* name : known)
        accepted += fmt::format("{}{}", accepted.empty() ? "" : ", ", name);
      reject(join(path, key), fmt::format("unknown key (accepted here: {})", accepted));
    }
  }
}

const json& object_at(const json& parent, const char* key, const std::string& path) {
  const json& value = parent.at(key);
  if (!value.is_object())
    reject(join(path, key), fmt::format("expected an object, got {}", value.dump()));
  return value;
}

double number_at(const json& object, const char* key, const std::string& path, double fallback,
                 double min, bool min_exclusive) {
  if (!object.contains(key)) return fallback;
  const json& value = object.at(key);
  const std::string where = join(path, key);
  if (!value.is_number()) reject(where, fmt::format("expected a number, got {}", value.dump()));
  const double number = value.get<double>();
  if (!std::isfinite(number) || number < min || (min_exclusive && number == min))
    reject(where, fmt::format("expected a number {} {}, got {}", min_exclusive ? ">" : ">=", min,
                              value.dump()));
  return number;
}

long long integer_at(const json& object, const char* key, const std::string& path,
                     long long fallback, long long min) {
  if (!object.contains(key)) return fallback;
  const json& value = object.at(key);
  const std::string where = join(path, key);
  if (!value.is_number_integer() || value.get<long long>() < min)
    reject(where, fmt::format("expected an integer >= {}, got {}", min, value.dump()));
  return value.get<long long>();
}

bool bool_at(const json& object, const char* key, const std::string& path, bool fallback) {
  if (!object.contains(key)) return fallback;
  const json& value = object.at(key);
  if (!value.is_boolean())
    reject(join(path, key), fmt::format("expected true or false, got {}", value.dump()));
  return value.get<bool>();
}

json without_auto(const json& object) {
  json kept = json::object();
  for (const auto& [key, value] : object.items()) {
    if (value != "auto") kept[key] = value;
  }
  return kept;
}

}  // namespace spillway::engine
