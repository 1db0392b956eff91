// Logging: the level threshold (log_enabled), the line format on stderr, that
// filtered messages write nothing, and that concurrent lines never interleave.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "allocator/config/log.h"

namespace spillway {
namespace {

// Restores the process-wide level whatever a test sets.
class ConfigLog : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = log_level(); }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::warn;
};

TEST_F(ConfigLog, DefaultLevelIsWarn) {
  // Nothing in this test binary changes the level before main (TearDown restores it).
  EXPECT_EQ(saved_, LogLevel::warn);
  EXPECT_TRUE(log_enabled(LogLevel::error));
  EXPECT_TRUE(log_enabled(LogLevel::warn));
  EXPECT_FALSE(log_enabled(LogLevel::info));
  EXPECT_FALSE(log_enabled(LogLevel::debug));
}

TEST_F(ConfigLog, ThresholdFiltersLowerLevels) {
  const LogLevel levels[] = {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug};
  for (LogLevel threshold : levels) {
    set_log_level(threshold);
    EXPECT_EQ(log_level(), threshold);
    for (LogLevel level : levels) {
      EXPECT_EQ(log_enabled(level), static_cast<int>(level) <= static_cast<int>(threshold))
          << "threshold " << to_string(threshold) << ", message " << to_string(level);
    }
  }
}

TEST_F(ConfigLog, WritesOneFormattedLineToStderr) {
  set_log_level(LogLevel::info);
  ::testing::internal::CaptureStderr();
  SPILLWAY_LOG(warn, "pinning {} bytes failed; using {}", 4096, "pageable memory");
  SPILLWAY_LOG(info, "chunk {} evicted", 7);
  SPILLWAY_LOG(debug, "not shown {}", 1);
  std::string captured = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(captured,
            "spillway[warn]: pinning 4096 bytes failed; using pageable memory\n"
            "spillway[info]: chunk 7 evicted\n");
}

TEST_F(ConfigLog, FilteredMessagesWriteNothing) {
  set_log_level(LogLevel::error);
  ::testing::internal::CaptureStderr();
  SPILLWAY_LOG(warn, "hidden");
  SPILLWAY_LOG(debug, "hidden {}", 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST_F(ConfigLog, ConcurrentLinesDoNotInterleave) {
  set_log_level(LogLevel::debug);
  constexpr int kThreads = 4;
  constexpr int kLinesPerThread = 200;
  const std::string payload(100, '=');
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLinesPerThread; ++i) SPILLWAY_LOG(debug, "t{} {} {}", t, i, payload);
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::istringstream lines(::testing::internal::GetCapturedStderr());
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    ++count;
    EXPECT_THAT(line, ::testing::MatchesRegex("spillway\\[debug\\]: t[0-9] [0-9]+ =+"));
    EXPECT_EQ(line.size() - line.find_last_not_of('='), payload.size() + 1) << line;
  }
  EXPECT_EQ(count, kThreads * kLinesPerThread);
}

}  // namespace
}  // namespace spillway
