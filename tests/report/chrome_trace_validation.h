// Checks a Chrome trace-event document the way the viewers read it; shared by
// the in-memory test and the command-line test.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <set>
#include <string>

namespace spillway::report::testing {

inline void expect_valid_chrome_trace(const nlohmann::json& document) {
  ASSERT_TRUE(document.is_object());
  ASSERT_TRUE(document.contains("traceEvents"));
  ASSERT_TRUE(document["traceEvents"].is_array());
  EXPECT_EQ(document.value("displayTimeUnit", ""), "ms");
  EXPECT_TRUE(document["metadata"].is_object());
  const std::set<std::string> allowed = {"C", "X", "i", "M"};
  double last_ts = 0;
  for (const nlohmann::json& event : document["traceEvents"]) {
    ASSERT_TRUE(event.contains("name") && event["name"].is_string()) << event;
    ASSERT_TRUE(event.contains("ph") && event["ph"].is_string()) << event;
    const std::string ph = event["ph"];
    EXPECT_TRUE(allowed.contains(ph)) << event;
    EXPECT_TRUE(event["pid"].is_number_integer()) << event;
    EXPECT_TRUE(event["tid"].is_number_integer()) << event;
    ASSERT_TRUE(event["ts"].is_number()) << event;
    const double ts = event["ts"].get<double>();
    EXPECT_GE(ts, 0) << event;
    if (ph == "M") continue;
    EXPECT_GE(ts, last_ts) << event;
    last_ts = ts;
    if (ph == "X") {
      ASSERT_TRUE(event["dur"].is_number()) << event;
      EXPECT_GE(event["dur"].get<double>(), 0) << event;
    }
    if (ph == "C") {
      ASSERT_TRUE(event["args"].is_object() && !event["args"].empty()) << event;
      for (const auto& [key, value] : event["args"].items())
        EXPECT_TRUE(value.is_number()) << event;
    }
    if (ph == "i") {
      const std::string scope = event.value("s", "");
      EXPECT_TRUE(scope == "g" || scope == "p" || scope == "t") << event;
    }
  }
}

}  // namespace spillway::report::testing
