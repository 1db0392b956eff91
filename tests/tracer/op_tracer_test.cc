// OpTracer: names interned once and defined before their first use, even
// with many threads racing into the recorder; op_begin/op_end fields as
// docs/trace-format.md says.
#include "tracer/op_tracer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/recording_trace_sink.h"
#include "tracer/trace_file.h"
#include "tracer/trace_recorder.h"

namespace spillway {
namespace {

TEST(tracer_OpTracer, RecordsOpsWithInternedNamesAndNesting) {
  testing::RecordingTraceSink sink;
  OpTracer tracer(sink);
  const TracedOp linear = tracer.begin("aten::linear", 0, 5, 1000);
  const TracedOp addmm = tracer.begin("aten::addmm", linear.sequence, 5, 1100);
  tracer.end(addmm, 1300);
  tracer.end(linear, 1400);
  const TracedOp again = tracer.begin("aten::addmm", 0, 6, 2000);
  tracer.end(again, 2500);
  EXPECT_EQ(tracer.ops_begun(), 3u);

  const std::vector<TraceEvent> events = sink.events();
  // Name 1 (2 records), begin, name 2 (2 records), begin, end, end, begin, end.
  ASSERT_EQ(events.size(), 10u);
  EXPECT_EQ(events[0].kind, TraceEventKind::op_name);
  EXPECT_EQ(events[0].client, 1u);
  EXPECT_EQ(events[0].stream, std::string("aten::linear").size());
  const TraceEvent& begin = events[5];
  EXPECT_EQ(begin.kind, TraceEventKind::op_begin);
  EXPECT_EQ(begin.client, 2u);  // aten::addmm
  EXPECT_EQ(begin.stream, 5u);  // the thread
  EXPECT_EQ(begin.address, addmm.sequence);
  EXPECT_EQ(begin.size, linear.sequence);  // the enclosing op
  const TraceEvent& end = events[6];
  EXPECT_EQ(end.kind, TraceEventKind::op_end);
  EXPECT_EQ(end.address, addmm.sequence);
  EXPECT_EQ(end.size, 200u);  // duration
  EXPECT_EQ(end.time_ns, 1300u);
  EXPECT_EQ(events[8].client, 2u);  // no second definition of aten::addmm
  EXPECT_EQ(events[8].stream, 6u);

  const TraceReadResult read = parse_trace(encode_trace({}, events));
  ASSERT_TRUE(read.ok()) << read.error;
  EXPECT_EQ(read.trace->op_names.at(1), "aten::linear");
  EXPECT_EQ(read.trace->op_names.at(2), "aten::addmm");
}

// Threads interning the same long names at once through the real recorder,
// with small batches: the file must still define every name, in one
// consecutive run, before its first use (the reader checks both).
TEST(tracer_OpTracer, ConcurrentThreadsProduceAValidFile) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("spillway_op_tracer_" + std::to_string(::getpid()) + ".trace");
  std::string error;
  auto recorder = TraceRecorder::open(path.string(), {}, &error, {.batch_events = 7});
  ASSERT_NE(recorder, nullptr) << error;
  OpTracer tracer(*recorder);
  constexpr int kThreads = 4, kOps = 500, kNames = 37;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        const std::string name = "aten::op_with_a_rather_long_name_" + std::to_string(i % kNames);
        const TracedOp op = tracer.begin(name, 0, trace_thread_id(), 1000 * i);
        tracer.end(op, 1000 * i + t);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(recorder->close());
  const TraceReadResult read = read_trace_file(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok()) << read.error;
  EXPECT_EQ(read.trace->op_names.size(), static_cast<std::size_t>(kNames));
  std::size_t begins = 0;
  for (const TraceEvent& e : read.trace->events) begins += e.kind == TraceEventKind::op_begin;
  EXPECT_EQ(begins, static_cast<std::size_t>(kThreads * kOps));
}

}  // namespace
}  // namespace spillway
