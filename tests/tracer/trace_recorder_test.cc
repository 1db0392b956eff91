// TraceRecorder: order across threads, bounded batches, flush, close, and
// behaviour after close. Run under TSan (SPILLWAY_SANITIZER=thread).
#include "tracer/trace_recorder.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace spillway {
namespace {

class tracer_TraceRecorder : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             ("spillway_recorder_" + std::string(info->name()) + "_" + std::to_string(::getpid()) +
              ".trace"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::string path_;
};

TEST_F(tracer_TraceRecorder, ManyThreadsKeepEachThreadsOrderAndLoseNothing) {
  constexpr int kThreads = 8;
  constexpr std::uint64_t kEventsPerThread = 20000;
  std::string error;
  // Small batches and a short queue make record() hit the backpressure path.
  auto recorder = TraceRecorder::open(path_, {{"test", "threads"}}, &error,
                                      {.batch_events = 64, .max_pending_batches = 2});
  ASSERT_NE(recorder, nullptr) << error;

  std::vector<std::thread> threads;
  std::atomic<int> flushes{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < kEventsPerThread; ++i) {
        TraceEvent event;
        event.time_ns = i;
        event.kind = (i % 2 == 0) ? TraceEventKind::alloc : TraceEventKind::free;
        event.stream = static_cast<std::uint64_t>(t);
        event.address = (static_cast<std::uint64_t>(t) << 32) | i;
        event.size = 512;
        recorder->record(event);
        if (t == 0 && i % 5000 == 0) {
          EXPECT_TRUE(recorder->flush());  // flushes interleaved with records
          ++flushes;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(recorder->close(42)) << recorder->error();
  EXPECT_EQ(recorder->recorded_events(), kThreads * kEventsPerThread);
  EXPECT_EQ(recorder->dropped_events(), 0u);
  EXPECT_GT(flushes.load(), 0);

  const TraceReadResult result = read_trace_file(path_);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->end_time_ns, 42u);
  ASSERT_EQ(result.trace->events.size(), kThreads * kEventsPerThread);
  std::vector<std::uint64_t> next(kThreads, 0);
  for (const TraceEvent& event : result.trace->events) {
    const auto thread = static_cast<int>(event.address >> 32);
    ASSERT_LT(thread, kThreads);
    ASSERT_EQ(event.address & 0xFFFFFFFF, next[thread]) << "thread " << thread << " out of order";
    ASSERT_EQ(event.stream, static_cast<std::uint64_t>(thread));
    ++next[thread];
  }
}

TEST_F(tracer_TraceRecorder, FlushMakesRecordedEventsReadable) {
  std::string error;
  auto recorder = TraceRecorder::open(path_, {}, &error);
  ASSERT_NE(recorder, nullptr) << error;
  for (std::uint64_t i = 0; i < 10; ++i) recorder->record({i, TraceEventKind::alloc, 0, i, 512});
  ASSERT_TRUE(recorder->flush());
  // Not closed yet: readable without the end record only.
  EXPECT_FALSE(read_trace_file(path_).ok());
  const TraceReadResult result = read_trace_file(path_, {.allow_missing_end = true});
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->events.size(), 10u);
  ASSERT_TRUE(recorder->close());
  EXPECT_TRUE(read_trace_file(path_).ok());
}

TEST_F(tracer_TraceRecorder, EventsAfterCloseAreDroppedAndCounted) {
  std::string error;
  auto recorder = TraceRecorder::open(path_, {}, &error);
  ASSERT_NE(recorder, nullptr) << error;
  recorder->record({1, TraceEventKind::alloc, 0, 1, 512});
  ASSERT_TRUE(recorder->close());
  ASSERT_TRUE(recorder->close());  // idempotent
  recorder->record({2, TraceEventKind::free, 0, 1, 512});
  EXPECT_TRUE(recorder->flush());
  EXPECT_EQ(recorder->recorded_events(), 1u);
  EXPECT_EQ(recorder->dropped_events(), 1u);
  const TraceReadResult result = read_trace_file(path_);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->events.size(), 1u);
}

TEST_F(tracer_TraceRecorder, CloseRacingWithRecordersIsSafe) {
  std::string error;
  auto recorder =
      TraceRecorder::open(path_, {}, &error, {.batch_events = 16, .max_pending_batches = 1});
  ASSERT_NE(recorder, nullptr) << error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (std::uint64_t i = 0; i < 5000; ++i)
        recorder->record({i, TraceEventKind::alloc, 0, i, 1});
    });
  }
  std::thread closer([&] { EXPECT_TRUE(recorder->close()); });
  for (auto& thread : threads) thread.join();
  closer.join();
  EXPECT_EQ(recorder->recorded_events() + recorder->dropped_events(), 4u * 5000);
  const TraceReadResult result = read_trace_file(path_);
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.trace->events.size(), recorder->recorded_events());
}

TEST_F(tracer_TraceRecorder, OpenFailsWithAMessage) {
  std::string error;
  EXPECT_EQ(TraceRecorder::open("/nonexistent/dir/x.trace", {}, &error), nullptr);
  EXPECT_NE(error.find("/nonexistent/dir/x.trace"), std::string::npos);
}

}  // namespace
}  // namespace spillway
