// The value grammars behind the option table (allocator/config/options.h): sizes with
// every unit, decimals rounded down exactly, overflow and sign rejection;
// fractions; rates; booleans.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "allocator/config/options.h"

namespace spillway::detail {
namespace {

constexpr std::uint64_t kKiB = 1024;

TEST(ConfigSize, NoUnitMeansBytes) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("  4096  "), 4096u);
  EXPECT_EQ(parse_size("000123"), 123u);
}

TEST(ConfigSize, EveryUnitInEveryCase) {
  const std::vector<std::pair<std::string, std::uint64_t>> units = {
      {"B", 1},
      {"KB", 1000},
      {"MB", 1000 * 1000},
      {"GB", 1000ull * 1000 * 1000},
      {"TB", 1000ull * 1000 * 1000 * 1000},
      {"KiB", kKiB},
      {"MiB", kKiB * kKiB},
      {"GiB", kKiB * kKiB * kKiB},
      {"TiB", kKiB * kKiB * kKiB * kKiB},
  };
  for (const auto& [unit, bytes] : units) {
    std::string lower, upper;
    for (char c : unit) {
      lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    for (const std::string& spelling : {unit, lower, upper}) {
      EXPECT_EQ(parse_size("3" + spelling), 3 * bytes) << spelling;
      EXPECT_EQ(parse_size("3 " + spelling), 3 * bytes) << spelling;
      EXPECT_EQ(parse_size("3\t" + spelling + " "), 3 * bytes) << spelling;
    }
  }
}

TEST(ConfigSize, DecimalsRoundDownExactly) {
  EXPECT_EQ(parse_size("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_size("1.5KiB"), 1536u);
  EXPECT_EQ(parse_size("0.5B"), 0u);
  EXPECT_EQ(parse_size("1.999B"), 1u);
  EXPECT_EQ(parse_size("0.001KB"), 1u);
  EXPECT_EQ(parse_size("0.0009999KB"), 0u);
  // 2^-40 TiB is exactly one byte: 40 decimal digits, exact with no rounding.
  EXPECT_EQ(parse_size("0.0000000000009094947017729282379150390625TiB"), 1u);
  EXPECT_EQ(parse_size("0.0000000000009094947017729282379150390624TiB"), 0u);
  EXPECT_EQ(parse_size("2.00000000000000000000000000000000000000000000001MB"), 2'000'000u);
  EXPECT_EQ(parse_size("0.1MB"), 100'000u);  // a double would give 0.1 * 1e6 = 100000.00000000001
}

TEST(ConfigSize, LargestAndOverflow) {
  constexpr std::uint64_t kMax = (std::uint64_t{1} << 63) - 1;
  EXPECT_EQ(parse_size("9223372036854775807"), kMax);
  EXPECT_EQ(parse_size("9223372036854775808"), std::nullopt);
  EXPECT_EQ(parse_size("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_size("99999999999999999999999999999999999999999TB"), std::nullopt);
  // 0.99999999999 TiB is 2^40 - 10.995... bytes, rounded down.
  EXPECT_EQ(parse_size("8388607.99999999999TiB"), (8388607ull << 40) + ((1ull << 40) - 11));
  EXPECT_EQ(parse_size("8388608TiB"), std::nullopt);  // exactly 2^63
  EXPECT_EQ(parse_size("9223372036854775807.9B"), kMax);
  EXPECT_EQ(parse_size("9223372036.854775808GB"), std::nullopt);
}

TEST(ConfigSize, RejectsWhatIsNotASize) {
  for (const char* text : {"",     " ",     "B",     "GB",  "-1",      "-1GB", "+1",    "1.",
                           ".5",   "1..5",  "1.5.5", "1e3", "nan",     "inf",  "0x10",  "1 2",
                           "1GBB", "1 G B", "1K",    "1Gi", "1 GiB/s", "one",  "1,5MB", "١"}) {
    EXPECT_EQ(parse_size(text), std::nullopt) << "'" << text << "'";
  }
}

TEST(ConfigFraction, InHalfOpenUnitInterval) {
  EXPECT_EQ(parse_fraction("0.9"), 0.9);
  EXPECT_EQ(parse_fraction("1"), 1.0);
  EXPECT_EQ(parse_fraction("1.0"), 1.0);
  EXPECT_EQ(parse_fraction("5e-1"), 0.5);
  EXPECT_EQ(parse_fraction(" 0.25 "), 0.25);
  for (const char* text : {"0", "0.0", "-0.5", "1.0000001", "2", "nan", "inf", "", ".", "0.5GB"}) {
    EXPECT_EQ(parse_fraction(text), std::nullopt) << text;
  }
}

TEST(ConfigRate, SizesPerSecond) {
  EXPECT_EQ(parse_rate("instant"), 0.0);
  EXPECT_EQ(parse_rate("Instant"), 0.0);
  EXPECT_EQ(parse_rate("0"), 0.0);
  EXPECT_EQ(parse_rate("25GB/s"), 25e9);
  EXPECT_EQ(parse_rate("25GB"), 25e9);
  EXPECT_EQ(parse_rate("25 gb/S"), 25e9);
  EXPECT_EQ(parse_rate("1"), 1.0);
  EXPECT_EQ(parse_rate("1e+30B/s"), 1e30);
  EXPECT_EQ(parse_rate("2KiB/s"), 2048.0);
  for (const char* text :
       {"", "/s", "GB/s", "-1GB/s", "+1GB/s", "0.5", "0.9B/s", "inf", "nan", "1e400", "1e308TB",
        "25GB/h", "25GB//s", "fast", "instantly", "25 G B/s"}) {
    EXPECT_EQ(parse_rate(text), std::nullopt) << text;
  }
}

TEST(ConfigBool, EverySpellingAnyCase) {
  for (const char* text : {"true", "TRUE", "tRuE", "1", "on", "ON", "yes", "Yes", " yes "}) {
    EXPECT_EQ(parse_bool(text), true) << text;
  }
  for (const char* text : {"false", "False", "0", "off", "oFF", "no", "NO"}) {
    EXPECT_EQ(parse_bool(text), false) << text;
  }
  for (const char* text : {"", "2", "y", "n", "t", "f", "yess", "tru e", "01"}) {
    EXPECT_EQ(parse_bool(text), std::nullopt) << text;
  }
}

TEST(ConfigTrim, AsciiWhitespaceOnly) {
  EXPECT_EQ(trim(" \t\n\r\f\vx y\v\f\r\n\t "), "x y");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim("\xa0x"), "\xa0x");  // not ASCII whitespace
}

}  // namespace
}  // namespace spillway::detail
