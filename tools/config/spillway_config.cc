// spillway-config: shows what a SPILLWAY_CONF string means.
//
//   SPILLWAY_CONF=chunk_size:16MB,policy:lru spillway-config
//   spillway-config --conf 'device:sim,sim_capacity:2GB'
//   spillway-config --keys
//
// Prints the effective configuration (every key, marked "set" or "default"),
// the same configuration in SPILLWAY_CONF syntax, then the table of keys. A
// bad configuration prints parse_config's error to stderr and exits 2, so
// scripts can check a string before a long job reads it.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "allocator/config/config.h"
#include "tools/common/tool_main.h"

namespace {

constexpr int kBadConfigurationExitCode = 2;

void print_effective_configuration(const spillway::ConfigResult& result, std::string_view source) {
  const spillway::Config& config = *result.config;
  fmt::print("Effective configuration ({}):\n", source);
  for (const spillway::OptionInfo& option : spillway::option_table()) {
    bool set_explicitly = std::find(result.explicit_keys.begin(), result.explicit_keys.end(),
                                    option.name) != result.explicit_keys.end();
    std::string line =
        fmt::format("{}: {}", option.name, spillway::format_option_value(config, option.name));
    fmt::print("  {:<40} ({})\n", line, set_explicitly ? "set" : "default");
  }
  fmt::print("As SPILLWAY_CONF:\n  {}\n", spillway::format_config(config));
}

void print_key_table() {
  fmt::print("Keys (name, default, accepted form, help):\n");
  for (const spillway::OptionInfo& option : spillway::option_table()) {
    std::string_view default_value =
        option.default_value.empty() ? "(empty)" : option.default_value;
    fmt::print("  {:<18} {:<9} {}\n  {:<28} {}\n", option.name, default_value, option.accepted_form,
               "", option.help);
  }
  fmt::print(
      "Syntax: key:value,key:value (whitespace around keys and values is ignored).\n"
      "Sizes: KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024; "
      "no unit means bytes.\n");
}

}  // namespace

namespace {

int tool_main(int argc, char** argv) {
  CLI::App app{"Print the effective spillway configuration (SPILLWAY_CONF) and its keys.",
               "spillway-config"};
  std::string conf_text;
  CLI::Option* conf_option =
      app.add_option("--conf", conf_text, "configuration string to check instead of SPILLWAY_CONF");
  bool keys_only = false;
  app.add_flag("--keys", keys_only, "print only the table of keys");
  CLI11_PARSE(app, argc, argv);

  if (keys_only) {
    print_key_table();
    return EXIT_SUCCESS;
  }

  std::string source;
  if (conf_option->count() > 0) {
    source = fmt::format("--conf '{}'", conf_text);
  } else if (const char* env = std::getenv("SPILLWAY_CONF")) {
    conf_text = env;
    source = fmt::format("SPILLWAY_CONF='{}'", conf_text);
  } else {
    source = "SPILLWAY_CONF unset: all defaults";
  }

  spillway::ConfigResult result = spillway::parse_config(conf_text);
  if (!result.ok()) {
    fmt::print(stderr, "{}\n", result.error->message);
    return kBadConfigurationExitCode;
  }
  print_effective_configuration(result, source);
  fmt::print("\n");
  print_key_table();
  return EXIT_SUCCESS;
}

}  // namespace

// Note [A tool fails out loud] (tools/common/tool_main.h).
int main(int argc, char** argv) {
  return spillway::run_tool("spillway-config", [&] { return tool_main(argc, argv); });
}
