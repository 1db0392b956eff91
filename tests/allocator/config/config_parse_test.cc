// parse_config and format_config: every key (its default and a non-default
// value), the item syntax (whitespace, empty items), every kind of error with
// the sentence it must produce, the option table's consistency with Config's
// defaults, format round trips, and ByteBudget::resolve.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include "allocator/config/config.h"

namespace spillway {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

Config parse_ok(std::string_view text) {
  ConfigResult result = parse_config(text);
  EXPECT_TRUE(result.ok()) << "text: '" << text
                           << "' error: " << (result.error ? result.error->message : "(none)");
  EXPECT_FALSE(result.error.has_value());
  return result.config.value_or(Config{});
}

ConfigError parse_error(std::string_view text) {
  ConfigResult result = parse_config(text);
  EXPECT_FALSE(result.ok()) << "text: '" << text << "' unexpectedly parsed";
  EXPECT_TRUE(result.error.has_value());
  return result.error.value_or(ConfigError{});
}

const OptionInfo& option(std::string_view key) {
  for (const OptionInfo& info : option_table()) {
    if (info.name == key) return info;
  }
  ADD_FAILURE() << "no option " << key;
  static OptionInfo missing;
  return missing;
}

TEST(ConfigParse, EmptyOrBlankTextGivesDefaults) {
  EXPECT_EQ(parse_ok(""), Config{});
  EXPECT_EQ(parse_ok("   \t\n "), Config{});
  EXPECT_EQ(parse_ok(",,, ,"), Config{});
  EXPECT_TRUE(parse_config("").explicit_keys.empty());
}

TEST(ConfigParse, DefaultsMatchTheDesign) {
  Config config;
  EXPECT_EQ(config.device, DeviceChoice::auto_select);
  EXPECT_EQ(config.device_budget, (ByteBudget{0, 0.9}));
  EXPECT_EQ(config.host_budget, (ByteBudget{0, 0.5}));
  EXPECT_EQ(config.chunk_size, 64'000'000u);
  EXPECT_EQ(config.policy, EvictionPolicyKind::planned);
  EXPECT_EQ(config.warmup_steps, 1);
  EXPECT_TRUE(config.prefetch);
  EXPECT_TRUE(config.expandable_segments);
  EXPECT_EQ(config.trace, "");
  EXPECT_EQ(config.cupti, CuptiMode::auto_select);
  EXPECT_FALSE(config.strict_residency);
  EXPECT_EQ(config.sim_capacity, 4'000'000'000u);
  EXPECT_EQ(config.sim_bandwidth, 0.0);
  EXPECT_EQ(config.log, LogLevel::warn);
  EXPECT_EQ(config.manage, ManageMode::automatic);
  EXPECT_EQ(config.dist, DistMode::off);
  EXPECT_EQ(config.dist_params, DistParams::replicated);
}

TEST(ConfigTable, KeysAreTheDesignedOnesInOrder) {
  std::vector<std::string> names;
  for (const OptionInfo& info : option_table()) names.emplace_back(info.name);
  EXPECT_THAT(names,
              ::testing::ElementsAre("device", "device_budget", "host_budget", "chunk_size",
                                     "expandable_segments", "policy", "warmup_steps", "prefetch",
                                     "manage", "dist", "dist_params", "trace", "cupti",
                                     "strict_residency", "sim_capacity", "sim_bandwidth", "log"));
}

TEST(ConfigTable, EveryRowIsDocumented) {
  for (const OptionInfo& info : option_table()) {
    EXPECT_FALSE(info.accepted_form.empty()) << info.name;
    EXPECT_FALSE(info.help.empty()) << info.name;
    EXPECT_EQ(info.help.find('\n'), std::string_view::npos) << info.name << ": help is one line";
  }
}

// The table's default column, read back through the parser, is Config{}: the
// documentation cannot claim a default the code does not have.
TEST(ConfigTable, DocumentedDefaultsParseToConfigDefaults) {
  for (const OptionInfo& info : option_table()) {
    std::string text = fmt::format("{}:{}", info.name, info.default_value);
    ConfigResult result = parse_config(text);
    ASSERT_TRUE(result.ok()) << text << ": " << result.error->message;
    EXPECT_EQ(*result.config, Config{}) << text;
    EXPECT_EQ(result.explicit_keys, std::vector<std::string>{std::string(info.name)});
  }
}

// One non-default value per key, and the field it must land in.
struct KeyCase {
  std::string text;
  std::function<bool(const Config&)> holds;
};

// Test names and ctest names show the text, not the struct's bytes.
void PrintTo(const KeyCase& key_case, std::ostream* out) { *out << key_case.text; }
std::string key_case_name(const ::testing::TestParamInfo<KeyCase>& info) {
  std::string name = fmt::format("{}_", info.index);
  for (char c : info.param.text) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return name;
}

class ConfigEveryKey : public ::testing::TestWithParam<KeyCase> {};

TEST_P(ConfigEveryKey, SetsItsFieldAndNothingElse) {
  const KeyCase& key_case = GetParam();
  Config config = parse_ok(key_case.text);
  EXPECT_TRUE(key_case.holds(config)) << key_case.text;
  EXPECT_NE(config, Config{}) << key_case.text << " should differ from the defaults";
  // Only the named key changed, and the result survives a format round trip.
  std::string key = key_case.text.substr(0, key_case.text.find(':'));
  Config defaults;
  std::string formatted = format_config(config);
  EXPECT_EQ(parse_ok(formatted), config);
  for (const OptionInfo& info : option_table()) {
    if (info.name == key) continue;
    EXPECT_EQ(format_option_value(config, info.name), format_option_value(defaults, info.name))
        << key_case.text << " changed " << info.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    NonDefaultValues, ConfigEveryKey,
    ::testing::Values(
        KeyCase{"device:cuda", [](const Config& c) { return c.device == DeviceChoice::cuda; }},
        KeyCase{"device:SIM", [](const Config& c) { return c.device == DeviceChoice::sim; }},
        KeyCase{"device_budget:8GB",
                [](const Config& c) {
                  return c.device_budget == ByteBudget{8'000'000'000, {}};
                }},
        KeyCase{"device_budget:0.25",
                [](const Config& c) {
                  return c.device_budget == ByteBudget{0, 0.25};
                }},
        KeyCase{"device_budget:1",
                [](const Config& c) {
                  return c.device_budget == ByteBudget{0, 1.0};
                }},
        KeyCase{"device_budget:0",
                [](const Config& c) {
                  return c.device_budget == ByteBudget{0, {}};
                }},
        KeyCase{"device_budget:4096",
                [](const Config& c) {
                  return c.device_budget == ByteBudget{4096, {}};
                }},
        KeyCase{"host_budget:16GiB",
                [](const Config& c) {
                  return c.host_budget == ByteBudget{16ull << 30, {}};
                }},
        KeyCase{"host_budget:0.75",
                [](const Config& c) {
                  return c.host_budget == ByteBudget{0, 0.75};
                }},
        KeyCase{"chunk_size:2MiB", [](const Config& c) { return c.chunk_size == 2u << 20; }},
        KeyCase{"chunk_size:3MB", [](const Config& c) { return c.chunk_size == 3000000; }},
        KeyCase{"chunk_size:1TiB", [](const Config& c) { return c.chunk_size == 1ull << 40; }},
        KeyCase{"policy:lru", [](const Config& c) { return c.policy == EvictionPolicyKind::lru; }},
        KeyCase{"policy:Static",
                [](const Config& c) { return c.policy == EvictionPolicyKind::static_residency; }},
        KeyCase{"warmup_steps:0", [](const Config& c) { return c.warmup_steps == 0; }},
        KeyCase{"warmup_steps:1000", [](const Config& c) { return c.warmup_steps == 1000; }},
        KeyCase{"warmup_steps:007", [](const Config& c) { return c.warmup_steps == 7; }},
        KeyCase{"prefetch:OFF", [](const Config& c) { return !c.prefetch; }},
        KeyCase{"expandable_segments:false",
                [](const Config& c) { return !c.expandable_segments; }},
        KeyCase{"trace:/tmp/run: 1/trace.json",
                [](const Config& c) { return c.trace == "/tmp/run: 1/trace.json"; }},
        KeyCase{"cupti:on", [](const Config& c) { return c.cupti == CuptiMode::on; }},
        KeyCase{"cupti:Off", [](const Config& c) { return c.cupti == CuptiMode::off; }},
        KeyCase{"strict_residency:Yes", [](const Config& c) { return c.strict_residency; }},
        KeyCase{"sim_capacity:512MiB",
                [](const Config& c) { return c.sim_capacity == 512u << 20; }},
        KeyCase{"sim_bandwidth:25GB/s", [](const Config& c) { return c.sim_bandwidth == 25e9; }},
        KeyCase{"sim_bandwidth:25GB", [](const Config& c) { return c.sim_bandwidth == 25e9; }},
        KeyCase{"sim_bandwidth:1.5 GiB/S",
                [](const Config& c) { return c.sim_bandwidth == 1.5 * (1u << 30); }},
        KeyCase{"manage:explicit",
                [](const Config& c) { return c.manage == ManageMode::explicit_calls; }},
        KeyCase{"manage:Explicit",
                [](const Config& c) { return c.manage == ManageMode::explicit_calls; }},
        KeyCase{"log:debug", [](const Config& c) { return c.log == LogLevel::debug; }},
        KeyCase{"log:ERROR", [](const Config& c) { return c.log == LogLevel::error; }}),
    key_case_name);

TEST(ConfigParse, SimBandwidthSpellingsOfInstant) {
  EXPECT_EQ(parse_ok("sim_bandwidth:instant").sim_bandwidth, 0.0);
  EXPECT_EQ(parse_ok("sim_bandwidth:INSTANT").sim_bandwidth, 0.0);
  EXPECT_EQ(parse_ok("sim_bandwidth:0").sim_bandwidth, 0.0);
  EXPECT_EQ(parse_ok("sim_bandwidth:0GB/s").sim_bandwidth, 0.0);
}

TEST(ConfigParse, TraceMayBeEmptyAndIsTrimmed) {
  EXPECT_EQ(parse_ok("trace:").trace, "");
  EXPECT_EQ(parse_ok("trace:   ").trace, "");
  EXPECT_EQ(parse_ok("trace:  /tmp/t.json  ,log:info").trace, "/tmp/t.json");
  EXPECT_EQ(parse_ok("trace:C:\\x").trace, "C:\\x");  // only the first ':' splits
}

TEST(ConfigParse, BooleansInAnyCase) {
  for (const char* yes : {"true", "TRUE", "True", "1", "on", "On", "yes", "YeS"}) {
    EXPECT_TRUE(parse_ok(fmt::format("prefetch:false,strict_residency:{}", yes)).strict_residency)
        << yes;
  }
  for (const char* no : {"false", "FALSE", "fAlSe", "0", "off", "OFF", "no", "No"}) {
    EXPECT_FALSE(parse_ok(fmt::format("strict_residency:true,prefetch:{}", no)).prefetch) << no;
  }
  for (const char* bad : {"t", "y", "2", "enabled", "truee", "o n"}) {
    EXPECT_EQ(parse_error(fmt::format("prefetch:{}", bad)).key, "prefetch") << bad;
  }
}

TEST(ConfigParse, WhitespaceAroundKeysAndValuesIsIgnored) {
  Config config = parse_ok(" \tchunk_size :  16 MiB ,\n policy\t:\tlru ,  ");
  EXPECT_EQ(config.chunk_size, 16u << 20);
  EXPECT_EQ(config.policy, EvictionPolicyKind::lru);
  EXPECT_EQ(parse_config(" chunk_size : 16MiB , policy:lru").explicit_keys,
            (std::vector<std::string>{"chunk_size", "policy"}));
}

TEST(ConfigParse, EmptyItemsAreSkipped) {
  Config config = parse_ok(",log:info,,, device:sim,");
  EXPECT_EQ(config.log, LogLevel::info);
  EXPECT_EQ(config.device, DeviceChoice::sim);
}

TEST(ConfigParse, AllKeysTogether) {
  Config config = parse_ok(
      "device:sim,device_budget:2GB,host_budget:0.25,chunk_size:8MB,policy:static,"
      "warmup_steps:3,prefetch:no,manage:explicit,trace:/tmp/x.json,cupti:off,strict_residency:1,"
      "sim_capacity:3GB,sim_bandwidth:10GB/s,log:info");
  Config expected;
  expected.device = DeviceChoice::sim;
  expected.device_budget = {2'000'000'000, {}};
  expected.host_budget = {0, 0.25};
  expected.chunk_size = 8'000'000;
  expected.policy = EvictionPolicyKind::static_residency;
  expected.warmup_steps = 3;
  expected.prefetch = false;
  expected.manage = ManageMode::explicit_calls;
  expected.trace = "/tmp/x.json";
  expected.cupti = CuptiMode::off;
  expected.strict_residency = true;
  expected.sim_capacity = 3'000'000'000;
  expected.sim_bandwidth = 10e9;
  expected.log = LogLevel::info;
  EXPECT_EQ(config, expected);
}

TEST(ConfigErrors, UnknownKeyListsTheKnownKeys) {
  ConfigError error = parse_error("bogus:1");
  EXPECT_EQ(error.key, "bogus");
  EXPECT_EQ(error.value, "1");
  EXPECT_THAT(error.message, StartsWith("SPILLWAY_CONF: unknown key 'bogus' (known keys: device, "
                                        "device_budget, host_budget, chunk_size,"));
  EXPECT_THAT(error.message, HasSubstr("sim_bandwidth, log)"));
  // Keys are exact: no case folding, no prefixes.
  EXPECT_EQ(parse_error("Chunk_Size:1MB").key, "Chunk_Size");
  EXPECT_EQ(parse_error("chunk:1MB").key, "chunk");
  EXPECT_EQ(parse_error("chunk size:1MB").key, "chunk size");
}

TEST(ConfigErrors, UnknownKeyAfterGoodOnes) {
  ConfigError error = parse_error("log:info, chunk_size:4MB, nope : x");
  EXPECT_EQ(error.key, "nope");
  EXPECT_EQ(error.value, "x");
}

TEST(ConfigErrors, DuplicateKeyNamesBothValues) {
  ConfigError error = parse_error("chunk_size:64MB,log:info,chunk_size:1GB");
  EXPECT_EQ(error.key, "chunk_size");
  EXPECT_EQ(error.value, "1GB");
  EXPECT_EQ(error.message,
            "SPILLWAY_CONF: duplicate key 'chunk_size' with value '1GB' (first given as '64MB'): "
            "each key may appear once");
  // Even the same value twice is a duplicate, and whitespace does not hide it.
  EXPECT_EQ(parse_error("log:info, log :info").key, "log");
}

TEST(ConfigErrors, MissingColon) {
  ConfigError error = parse_error("log:info,chunk_size64MB");
  EXPECT_EQ(error.key, "");
  EXPECT_EQ(error.value, "chunk_size64MB");
  EXPECT_EQ(error.message,
            "SPILLWAY_CONF: missing ':' in item 'chunk_size64MB': expected key:value items "
            "separated by ',' such as chunk_size:64MB");
  EXPECT_EQ(parse_error("device").value, "device");
  EXPECT_EQ(parse_error("device=sim").value, "device=sim");  // '=' is not PyTorch's syntax
}

TEST(ConfigErrors, MissingKey) {
  ConfigError error = parse_error(" : 5");
  EXPECT_EQ(error.key, "");
  EXPECT_THAT(error.message, StartsWith("SPILLWAY_CONF: missing key before ':' in item ': 5'"));
  EXPECT_THAT(error.message, HasSubstr("device, device_budget"));
}

TEST(ConfigErrors, BadValueSentenceNamesKeyValueAndForm) {
  ConfigError error = parse_error("chunk_size:abc");
  EXPECT_EQ(error.key, "chunk_size");
  EXPECT_EQ(error.value, "abc");
  EXPECT_EQ(error.message,
            "SPILLWAY_CONF: bad value 'abc' for 'chunk_size': expected a size from 2MiB to 1TiB "
            "such as 64MB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

// For each key, values it must refuse; the error names the key, the trimmed
// value and the row's accepted form.
TEST(ConfigErrors, EveryKeyRejectsBadValues) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad_values = {
      {"device", {"", "gpu", "cuda0", "autos"}},
      {"device_budget", {"", "1.5", "0.0", "-0.5", "2x", "nan", "inf", "1e3", "-1GB", "0x10"}},
      {"host_budget", {"", "abc", "1.0001", "-1", "50%"}},
      {"chunk_size",
       {"", "4096", "1MiB", "2097151B", "1TiB1", "1.1TiB", "-64MB", "64 M B", "64MBs", "1e6"}},
      {"policy", {"", "fifo", "plan"}},
      {"warmup_steps", {"", "-1", "+1", "1001", "1.0", "99999999999999999999", "one", "1 0"}},
      {"prefetch", {"", "maybe"}},
      {"expandable_segments", {"", "True1", "enabled"}},
      {"cupti", {"", "true", "yes"}},
      {"strict_residency", {"", "2"}},
      {"sim_capacity", {"", "4GBB", "-4GB", "4 G", "9223372036854775808", "8388608TiB", "NaN"}},
      {"sim_bandwidth", {"", "fast", "-1GB/s", "0.5B/s", "25GB/m", "inf", "1e400", "nan/s", "/s"}},
      {"log", {"", "trace", "warning", "0"}},
  };
  for (const auto& [key, values] : bad_values) {
    for (const std::string& value : values) {
      ConfigError error = parse_error(fmt::format("{}: {} ", key, value));
      EXPECT_EQ(error.key, key) << value;
      EXPECT_EQ(error.value, value) << key;
      EXPECT_EQ(error.message, fmt::format("SPILLWAY_CONF: bad value '{}' for '{}': expected {}",
                                           value, key, option(key).accepted_form))
          << key << ":" << value;
    }
  }
}

TEST(ConfigErrors, FirstErrorWinsAndNoConfigComesWithIt) {
  ConfigResult result = parse_config("log:loud,bogus:1");
  EXPECT_FALSE(result.ok());
  EXPECT_FALSE(result.config.has_value());
  EXPECT_EQ(result.error->key, "log");
}

TEST(ConfigFormat, DefaultsFormatInTableOrder) {
  EXPECT_EQ(format_config(Config{}),
            "device:auto,device_budget:0.9,host_budget:0.5,chunk_size:64000000B,"
            "expandable_segments:true,policy:planned,"
            "warmup_steps:1,prefetch:true,manage:auto,dist:off,dist_params:replicated,trace:,cupti:"
            "auto,strict_residency:false,"
            "sim_capacity:4000000000B,sim_bandwidth:instant,log:warn");
}

TEST(ConfigFormat, RoundTripsExactly) {
  Config config;
  config.device = DeviceChoice::cuda;
  config.device_budget = {0, 0.1 + 0.2};        // not a short decimal: needs every digit
  config.host_budget = {(1ull << 62) + 1, {}};  // beyond double's 53 bits
  config.chunk_size = (2u << 20) + 1;
  config.policy = EvictionPolicyKind::lru;
  config.warmup_steps = 999;
  config.prefetch = false;
  config.trace = "/tmp/a b:c.json";
  config.cupti = CuptiMode::on;
  config.strict_residency = true;
  config.sim_capacity = 0;
  config.sim_bandwidth = 1.0 / 3.0 * 1e10;
  config.log = LogLevel::debug;
  std::string text = format_config(config);
  EXPECT_EQ(parse_ok(text), config) << text;

  config.device_budget = {1, {}};  // a 1-byte budget must not read back as "all of it"
  config.host_budget = {0, std::numeric_limits<double>::min()};
  config.sim_bandwidth = 1e300;
  text = format_config(config);
  EXPECT_EQ(parse_ok(text), config) << text;
}

TEST(ConfigFormat, OptionValueOfEachKey) {
  Config config = parse_ok("chunk_size:2MiB,device_budget:0.5,sim_bandwidth:1KB/s,log:info");
  EXPECT_EQ(format_option_value(config, "chunk_size"), "2097152B");
  EXPECT_EQ(format_option_value(config, "device_budget"), "0.5");
  EXPECT_EQ(format_option_value(config, "sim_bandwidth"), "1000B/s");
  EXPECT_EQ(format_option_value(config, "log"), "info");
  EXPECT_EQ(format_option_value(config, "trace"), "");
  EXPECT_EQ(format_option_value(config, "bogus"), "");
}

TEST(ConfigByteBudget, ResolvesBytesAndFractions) {
  EXPECT_EQ((ByteBudget{123, {}}).resolve(1000), 123u);
  EXPECT_EQ((ByteBudget{5000, {}}).resolve(1000), 5000u);  // bytes are not capped by the total
  EXPECT_EQ((ByteBudget{0, 0.5}).resolve(1000), 500u);
  EXPECT_EQ((ByteBudget{0, 0.9}).resolve(1001), 900u);  // floor(900.9)
  EXPECT_EQ((ByteBudget{0, 1.0}).resolve(1001), 1001u);
  EXPECT_EQ((ByteBudget{0, 0.3}).resolve(10), 3u);  // not floor(10 * 0.2999...) = 2
  EXPECT_EQ((ByteBudget{0, 0.5}).resolve(0), 0u);
  constexpr std::size_t kHuge = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ((ByteBudget{0, 1.0}).resolve(kHuge), kHuge);
  EXPECT_LE((ByteBudget{0, 0.9}).resolve(kHuge), kHuge);
  EXPECT_EQ((ByteBudget{0, 0.5}).resolve(80ull << 30), 40ull << 30);
}

TEST(ConfigEnvironment, ReadsSpillwayConf) {
  ASSERT_EQ(setenv("SPILLWAY_CONF", "policy:lru, log:debug", 1), 0);
  ConfigResult result = config_from_environment();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.config->policy, EvictionPolicyKind::lru);
  EXPECT_EQ(result.config->log, LogLevel::debug);

  ASSERT_EQ(setenv("SPILLWAY_CONF", "bogus:1", 1), 0);
  result = config_from_environment();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error->key, "bogus");

  ASSERT_EQ(unsetenv("SPILLWAY_CONF"), 0);
  result = config_from_environment();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(*result.config, Config{});
}

TEST(ConfigEnums, NamesAreTheParsersSpellings) {
  for (DeviceChoice value : {DeviceChoice::auto_select, DeviceChoice::cuda, DeviceChoice::sim}) {
    EXPECT_EQ(parse_ok(fmt::format("device:{}", to_string(value))).device, value);
  }
  for (EvictionPolicyKind value : {EvictionPolicyKind::planned, EvictionPolicyKind::lru,
                                   EvictionPolicyKind::static_residency}) {
    EXPECT_EQ(parse_ok(fmt::format("policy:{}", to_string(value))).policy, value);
  }
  for (CuptiMode value : {CuptiMode::auto_select, CuptiMode::on, CuptiMode::off}) {
    EXPECT_EQ(parse_ok(fmt::format("cupti:{}", to_string(value))).cupti, value);
  }
  for (LogLevel value : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug}) {
    EXPECT_EQ(parse_ok(fmt::format("log:{}", to_string(value))).log, value);
  }
  EXPECT_EQ(to_string(EvictionPolicyKind::static_residency), "static");
  EXPECT_EQ(to_string(DeviceChoice::auto_select), "auto");
}

}  // namespace
}  // namespace spillway
