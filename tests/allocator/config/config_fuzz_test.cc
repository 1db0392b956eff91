// Randomized tests of parse_config: thousands of generated strings (random
// bytes, mutations of valid strings, random key/value combinations) must each
// give exactly one of a configuration or an error, never a crash (run under
// ASan+UBSan too); every configuration must survive format_config/parse_config
// unchanged, and every error must be a sentence that names its key.
//
// The seed is fixed so failures reproduce; SPILLWAY_FUZZ_SEED picks another.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "allocator/config/config.h"

namespace spillway {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kStringsPerGenerator = 7000;  // three generators: 21000 strings in all

std::uint64_t fuzz_seed() {
  const char* text = std::getenv("SPILLWAY_FUZZ_SEED");
  return text != nullptr ? std::strtoull(text, nullptr, 0) : 0x5b111a4ull;
}

struct Outcomes {
  int configs = 0;
  int errors = 0;
  ~Outcomes() {  // recorded in the test's XML report, to see what a generator explores
    ::testing::Test::RecordProperty("config_count", configs);
    ::testing::Test::RecordProperty("error_count", errors);
  }
};

// The contract every input must meet.
void check_parse(std::string_view text, Outcomes& outcomes) {
  ConfigResult result = parse_config(text);
  ASSERT_NE(result.config.has_value(), result.error.has_value())
      << "exactly one of config/error for '" << text << "'";
  ASSERT_EQ(result.ok(), result.config.has_value());
  if (result.error) {
    ++outcomes.errors;
    const ConfigError& error = *result.error;
    EXPECT_THAT(error.message, StartsWith("SPILLWAY_CONF: ")) << text;
    if (!error.key.empty()) {
      EXPECT_THAT(error.message, HasSubstr("'" + error.key + "'")) << text;
    }
    EXPECT_TRUE(result.explicit_keys.empty()) << text;
    return;
  }
  ++outcomes.configs;
  std::string formatted = format_config(*result.config);
  ConfigResult again = parse_config(formatted);
  ASSERT_TRUE(again.ok()) << "input '" << text << "' formatted as '" << formatted
                          << "' fails: " << again.error->message;
  EXPECT_EQ(*again.config, *result.config) << "input '" << text << "' formatted '" << formatted;
  EXPECT_EQ(format_config(*again.config), formatted);
  std::set<std::string> keys;
  for (const std::string& key : result.explicit_keys) {
    EXPECT_TRUE(keys.insert(key).second) << "key given twice: " << key << " in '" << text << "'";
    EXPECT_FALSE(format_option_value(Config{}, key).empty() && key != "trace") << key;
  }
}

class ConfigFuzz : public ::testing::Test {
 protected:
  std::mt19937_64 rng_{fuzz_seed()};

  std::size_t below(std::size_t bound) {
    return std::uniform_int_distribution<std::size_t>(0, bound - 1)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[below(items.size())];
  }

  std::string random_bytes() {
    static const std::string kSyntax = ",:, : \t.0123456789";
    std::string text(below(48), '\0');
    for (char& c : text) {
      c = chance(0.3) ? kSyntax[below(kSyntax.size())] : static_cast<char>(below(256));
    }
    return text;
  }

  std::string random_key() {
    static const std::vector<std::string> kJunkKeys = {
        "", " ", "bogus", "Device", "chunk", "chunk_size ", "log log", "sim_", ":", "\xff", "k"};
    if (chance(0.85)) return std::string(option_table()[below(option_table().size())].name);
    return pick(kJunkKeys);
  }

  std::string random_number() {
    std::string digits;
    std::size_t length = 1 + below(chance(0.1) ? 30 : 6);
    for (std::size_t i = 0; i < length; ++i) digits += static_cast<char>('0' + below(10));
    if (chance(0.3)) {
      digits += '.';
      std::size_t decimals = below(chance(0.1) ? 50 : 4);
      for (std::size_t i = 0; i < decimals; ++i) digits += static_cast<char>('0' + below(10));
    }
    if (chance(0.05)) digits = "-" + digits;
    if (chance(0.05)) digits += "e" + std::to_string(below(700));
    return digits;
  }

  std::string random_value() {
    static const std::vector<std::string> kUnits = {"",    "B",   "KB",  "MB",  "GB",
                                                    "TB",  "KiB", "MiB", "GiB", "TiB",
                                                    "kib", "gb",  "X",   "/s",  "GB/s"};
    static const std::vector<std::string> kWords = {"auto",
                                                    "cuda",
                                                    "sim",
                                                    "planned",
                                                    "lru",
                                                    "static",
                                                    "on",
                                                    "off",
                                                    "true",
                                                    "false",
                                                    "yes",
                                                    "no",
                                                    "1",
                                                    "0",
                                                    "error",
                                                    "warn",
                                                    "info",
                                                    "debug",
                                                    "TRUE",
                                                    "Off",
                                                    "0.9",
                                                    "0.5",
                                                    "1.0",
                                                    "1e-5",
                                                    "nan",
                                                    "inf",
                                                    "-0",
                                                    "4KiB",
                                                    "64MB",
                                                    "1TiB",
                                                    "instant",
                                                    "25GB/s",
                                                    "/tmp/t",
                                                    "",
                                                    "C:\\x:y",
                                                    "1e308",
                                                    "4095",
                                                    "1001",
                                                    "1000",
                                                    "4096",
                                                    "0x10",
                                                    "  ",
                                                    "9223372036854775807",
                                                    "9223372036854775808",
                                                    "1e-320",
                                                    "4.9e-324"};
    std::string value =
        chance(0.5) ? pick(kWords) : random_number() + (chance(0.2) ? " " : "") + pick(kUnits);
    return value;
  }

  std::string random_spaces() { return std::string(chance(0.3) ? below(3) : 0, ' '); }

  std::string random_combo() {
    std::string text;
    std::size_t items = below(7);
    for (std::size_t i = 0; i < items; ++i) {
      if (i > 0 || chance(0.1)) text += ',';
      text += random_spaces() + random_key() + random_spaces();
      if (chance(0.97)) text += ':';
      text += random_spaces() + random_value() + random_spaces();
    }
    if (chance(0.1)) text += ',';
    return text;
  }

  // A valid configuration string: a random config, formatted; or a combo of
  // distinct keys with valid values.
  std::string random_valid_string() {
    if (chance(0.5)) return format_config(random_config());
    static const std::vector<std::string> kValid = {
        "device:sim,sim_capacity:1GiB,sim_bandwidth:10GB/s",
        " chunk_size : 16MiB , policy:lru, log:DEBUG,",
        "device_budget:0.5,host_budget:8GB,prefetch:off,strict_residency:YES",
        "trace:/tmp/trace.json,cupti:off,warmup_steps:3"};
    return pick(kValid);
  }

  std::string mutate(std::string text) {
    static const std::string kAlphabet = ",:: \t.0123456789aBkKmMgGiIsS/-+e\xff";
    std::size_t mutations = 1 + below(4);
    for (std::size_t m = 0; m < mutations; ++m) {
      std::size_t at = text.empty() ? 0 : below(text.size() + 1);
      switch (below(6)) {
        case 0:  // delete
          if (at < text.size()) text.erase(at, 1 + below(3));
          break;
        case 1:  // insert
          text.insert(at, 1, chance(0.1) ? '\0' : kAlphabet[below(kAlphabet.size())]);
          break;
        case 2:  // replace
          if (at < text.size()) text[at] = kAlphabet[below(kAlphabet.size())];
          break;
        case 3:  // duplicate a slice (often a whole item: a duplicate key)
          if (!text.empty()) {
            std::size_t from = below(text.size());
            text.insert(at, text.substr(from, 1 + below(20)));
          }
          break;
        case 4:  // truncate
          text.resize(at);
          break;
        default:  // append a random item
          text += "," + random_key() + ":" + random_value();
          break;
      }
    }
    return text;
  }

  // A Config within the table's ranges, for the programmatic round trip.
  Config random_config() {
    auto random_budget = [&]() -> ByteBudget {
      switch (below(4)) {
        case 0:
          return {0, 1.0};
        case 1:
          return {0, std::uniform_real_distribution<double>(1e-12, 1.0)(rng_)};
        default:
          return {static_cast<std::size_t>(rng_() >> (1 + below(63))), {}};
      }
    };
    Config config;
    config.device = static_cast<DeviceChoice>(below(3));
    config.device_budget = random_budget();
    config.host_budget = random_budget();
    config.chunk_size =
        (std::size_t{2} << 20) + below((std::size_t{1} << 40) - (std::size_t{2} << 20) + 1);
    config.policy = static_cast<EvictionPolicyKind>(below(3));
    config.warmup_steps = static_cast<int>(below(1001));
    config.prefetch = chance(0.5);
    config.manage = static_cast<ManageMode>(below(2));
    config.dist = static_cast<DistMode>(below(2));
    config.dist_params = static_cast<DistParams>(below(2));
    config.expandable_segments = chance(0.5);
    // Any path the item syntax can carry: no ',', no whitespace at either end.
    static const std::string kPathChars = "abc/._-: XYZ09\\";
    std::string trace(below(12), 'x');
    for (char& c : trace) c = kPathChars[below(kPathChars.size())];
    if (!trace.empty() && trace.front() == ' ') trace.front() = 'p';
    if (!trace.empty() && trace.back() == ' ') trace.back() = 'p';
    config.trace = trace;
    config.cupti = static_cast<CuptiMode>(below(3));
    config.strict_residency = chance(0.5);
    config.sim_capacity = static_cast<std::size_t>(rng_() >> (1 + below(63)));
    config.sim_bandwidth =
        chance(0.3) ? 0.0 : std::exp(std::uniform_real_distribution<double>(0.0, 80.0)(rng_));
    config.log = static_cast<LogLevel>(below(4));
    return config;
  }
};

TEST_F(ConfigFuzz, RandomBytesGiveConfigOrError) {
  SCOPED_TRACE(fmt::format("SPILLWAY_FUZZ_SEED={:#x}", fuzz_seed()));
  Outcomes outcomes;
  for (int i = 0; i < kStringsPerGenerator && !HasFailure(); ++i) {
    check_parse(random_bytes(), outcomes);
  }
  EXPECT_GT(outcomes.errors, kStringsPerGenerator / 2);
}

TEST_F(ConfigFuzz, MutatedValidStringsGiveConfigOrError) {
  SCOPED_TRACE(fmt::format("SPILLWAY_FUZZ_SEED={:#x}", fuzz_seed()));
  Outcomes outcomes;
  for (int i = 0; i < kStringsPerGenerator && !HasFailure(); ++i) {
    check_parse(mutate(random_valid_string()), outcomes);
  }
  // Both outcomes must be common, or the generator is not exploring the boundary.
  EXPECT_GT(outcomes.configs, kStringsPerGenerator / 20);
  EXPECT_GT(outcomes.errors, kStringsPerGenerator / 20);
}

TEST_F(ConfigFuzz, RandomKeyValueCombosGiveConfigOrError) {
  SCOPED_TRACE(fmt::format("SPILLWAY_FUZZ_SEED={:#x}", fuzz_seed()));
  Outcomes outcomes;
  for (int i = 0; i < kStringsPerGenerator && !HasFailure(); ++i) {
    check_parse(random_combo(), outcomes);
  }
  EXPECT_GT(outcomes.configs, kStringsPerGenerator / 20);
  EXPECT_GT(outcomes.errors, kStringsPerGenerator / 20);
}

TEST_F(ConfigFuzz, RandomConfigsRoundTripThroughFormat) {
  SCOPED_TRACE(fmt::format("SPILLWAY_FUZZ_SEED={:#x}", fuzz_seed()));
  for (int i = 0; i < 2000 && !HasFailure(); ++i) {
    Config config = random_config();
    std::string text = format_config(config);
    ConfigResult result = parse_config(text);
    ASSERT_TRUE(result.ok()) << text << ": " << result.error->message;
    EXPECT_EQ(*result.config, config) << text;
    EXPECT_EQ(result.explicit_keys.size(), option_table().size());
  }
}

}  // namespace
}  // namespace spillway
