// Reading a DeepSpeed-style JSON configuration field by field: every
// rejection names the field by its dotted path ("fp16.loss_scale_window")
// and says what it accepts, so a user fixes a config from one message.
#pragma once

#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace spillway::engine {

// Throws std::invalid_argument("engine config: <path>: <what>").
[[noreturn]] void reject(const std::string& path, const std::string& what);

// "parent.key", or "key" at the top level (parent empty).
std::string join(const std::string& parent, const std::string& key);

// Every key of `object` must be one of `known`.
void check_keys(const nlohmann::json& object, const std::string& path,
                std::initializer_list<const char*> known);

// parent[key], which must be an object.
const nlohmann::json& object_at(const nlohmann::json& parent, const char* key,
                                const std::string& path);

// object[key] or `fallback` when absent; finite and >= min (> min when
// min_exclusive).
double number_at(const nlohmann::json& object, const char* key, const std::string& path,
                 double fallback, double min, bool min_exclusive = false);

// object[key] or `fallback` when absent; an integer >= min.
long long integer_at(const nlohmann::json& object, const char* key, const std::string& path,
                     long long fallback, long long min);

// object[key] or `fallback` when absent; true or false.
bool bool_at(const nlohmann::json& object, const char* key, const std::string& path, bool fallback);

// `object` without its keys whose value is "auto": DeepSpeed's pydantic
// config blocks (fp16, bf16, zero_optimization and its offloads) drop them
// (DeepSpeedConfigModel), so each such key takes its default.
nlohmann::json without_auto(const nlohmann::json& object);

}  // namespace spillway::engine
