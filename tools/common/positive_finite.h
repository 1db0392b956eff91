// A CLI11 check for rates and ratios: a number greater than 0 and finite.
// CLI::PositiveNumber lets "nan" through (nan <= 0 is false).
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace spillway {

inline CLI::Validator positive_finite() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value) || value <= 0)
          return "'" + text + "' is not a positive finite number";
        return {};
      },
      "POSITIVE");
}

}  // namespace spillway
