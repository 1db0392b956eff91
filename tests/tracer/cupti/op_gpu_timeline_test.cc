// OpGpuTimeline: joining activities with the op ids of their correlation
// records, whichever arrives first and in whichever buffer; per-op counts,
// bytes, first start, last end and busy time; uncorrelated activities; and
// one thread adding while another reads (run under TSan).
#include "tracer/cupti/op_gpu_timeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace spillway {
namespace {

GpuActivity kernel(std::uint32_t correlation_id, std::uint64_t start_ns, std::uint64_t end_ns,
                   std::uint32_t stream_id = 7) {
  GpuActivity activity;
  activity.kind = GpuActivityKind::kernel;
  activity.correlation_id = correlation_id;
  activity.start_ns = start_ns;
  activity.end_ns = end_ns;
  activity.stream_id = stream_id;
  return activity;
}

GpuActivity memcpy_activity(std::uint32_t correlation_id, std::uint64_t bytes,
                            std::uint64_t start_ns, std::uint64_t end_ns) {
  GpuActivity activity = kernel(correlation_id, start_ns, end_ns);
  activity.kind = GpuActivityKind::memcpy;
  activity.bytes = bytes;
  activity.direction = CopyDirection::host_to_device;
  return activity;
}

TEST(cupti_Timeline, CorrelationBeforeItsKernelsInOneBuffer) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{kernel(10, 100, 200), kernel(11, 300, 350)};
  std::vector<ExternalCorrelation> correlations{{10, 5}, {11, 5}};
  timeline.add(activities, correlations);

  std::optional<OpGpuTime> op = timeline.op(5);
  ASSERT_TRUE(op.has_value());
  EXPECT_EQ(op->kernel_count, 2u);
  EXPECT_EQ(op->memcpy_count, 0u);
  EXPECT_EQ(op->first_start_ns, 100u);
  EXPECT_EQ(op->last_end_ns, 350u);
  EXPECT_EQ(op->busy_ns, 150u);
  EXPECT_EQ(timeline.uncorrelated_count(), 0u);
}

TEST(cupti_Timeline, KernelsBeforeTheirCorrelationInAnEarlierBuffer) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> first_buffer{kernel(20, 1000, 1100), kernel(21, 1200, 1300)};
  timeline.add(first_buffer, {});
  EXPECT_FALSE(timeline.op(9).has_value());
  EXPECT_EQ(timeline.uncorrelated_count(), 2u);

  std::vector<ExternalCorrelation> second_buffer{{20, 9}};
  timeline.add({}, second_buffer);
  ASSERT_TRUE(timeline.op(9).has_value());
  EXPECT_EQ(timeline.op(9)->kernel_count, 1u);
  EXPECT_EQ(timeline.uncorrelated_count(), 1u);  // 21 still waits

  std::vector<ExternalCorrelation> third_buffer{{21, 9}};
  timeline.add({}, third_buffer);
  EXPECT_EQ(timeline.op(9)->kernel_count, 2u);
  EXPECT_EQ(timeline.op(9)->busy_ns, 200u);
  EXPECT_EQ(timeline.uncorrelated_count(), 0u);
}

TEST(cupti_Timeline, CorrelationInAnEarlierBufferThanItsKernel) {
  OpGpuTimeline timeline;
  std::vector<ExternalCorrelation> correlations{{30, 4}};
  timeline.add({}, correlations);
  EXPECT_FALSE(timeline.op(4).has_value());

  std::vector<GpuActivity> activities{kernel(30, 50, 80)};
  timeline.add(activities, {});
  ASSERT_TRUE(timeline.op(4).has_value());
  EXPECT_EQ(timeline.op(4)->kernel_count, 1u);
}

TEST(cupti_Timeline, BusyTimeCountsOverlappingStreamsOnce) {
  OpGpuTimeline timeline;
  // [100,200] and [150,300] overlap on two streams; [400,450] after a gap.
  std::vector<GpuActivity> activities{kernel(1, 400, 450, 1), kernel(2, 100, 200, 1),
                                      kernel(3, 150, 300, 2)};
  std::vector<ExternalCorrelation> correlations{{1, 3}, {2, 3}, {3, 3}};
  timeline.add(activities, correlations);

  OpGpuTime op = *timeline.op(3);
  EXPECT_EQ(op.kernel_count, 3u);
  EXPECT_EQ(op.first_start_ns, 100u);
  EXPECT_EQ(op.last_end_ns, 450u);
  EXPECT_EQ(op.busy_ns, 200u + 50u);
}

TEST(cupti_Timeline, AnIntervalInsideAnotherAddsNothing) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{kernel(1, 100, 500), kernel(2, 200, 300)};
  std::vector<ExternalCorrelation> correlations{{1, 1}, {2, 1}};
  timeline.add(activities, correlations);
  EXPECT_EQ(timeline.op(1)->busy_ns, 400u);
  EXPECT_EQ(timeline.op(1)->last_end_ns, 500u);
}

TEST(cupti_Timeline, MemcpyCountsAndBytes) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{memcpy_activity(40, 4096, 10, 20),
                                      memcpy_activity(41, 1 << 20, 30, 90), kernel(42, 95, 99)};
  std::vector<ExternalCorrelation> correlations{{40, 2}, {41, 2}, {42, 2}};
  timeline.add(activities, correlations);

  OpGpuTime op = *timeline.op(2);
  EXPECT_EQ(op.memcpy_count, 2u);
  EXPECT_EQ(op.memcpy_bytes, 4096u + (1u << 20));
  EXPECT_EQ(op.kernel_count, 1u);
  EXPECT_EQ(op.busy_ns, 10u + 60u + 4u);
}

// Note [Two correlation ids]: a copy whose correlation record names the
// runtime call (cudaMemcpyAsync) rather than the driver call still joins.
TEST(cupti_Timeline, MemcpyJoinsThroughItsRuntimeCorrelationId) {
  OpGpuTimeline timeline;
  GpuActivity copy = memcpy_activity(/*driver call*/ 51, 64, 1, 2);
  copy.runtime_correlation_id = 50;
  std::vector<GpuActivity> activities{copy};
  std::vector<ExternalCorrelation> correlations{{50, 8}};
  timeline.add(activities, correlations);
  ASSERT_TRUE(timeline.op(8).has_value());
  EXPECT_EQ(timeline.op(8)->memcpy_count, 1u);
  EXPECT_EQ(timeline.uncorrelated_count(), 0u);
}

TEST(cupti_Timeline, ActivityWithoutACorrelationIsUncorrelated) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{kernel(60, 1, 2), kernel(61, 3, 4)};
  std::vector<ExternalCorrelation> correlations{{60, 1}};
  timeline.add(activities, correlations);
  EXPECT_EQ(timeline.uncorrelated_count(), 1u);
  ASSERT_EQ(timeline.ops().size(), 1u);
  EXPECT_EQ(timeline.ops().at(1).kernel_count, 1u);
}

// CUPTI tags an API call with the innermost pushed id: an outer op keeps
// only what it launched outside the inner one.
TEST(cupti_Timeline, NestedOpsGetTheKernelsOfTheirInnermostRange) {
  OpGpuTimeline timeline;
  // push 1; kernel 70; push 2; kernel 71; pop; kernel 72; pop
  std::vector<GpuActivity> activities{kernel(70, 0 + 10, 20), kernel(71, 30, 40),
                                      kernel(72, 50, 60)};
  std::vector<ExternalCorrelation> correlations{{70, 1}, {71, 2}, {72, 1}};
  timeline.add(activities, correlations);

  std::map<std::uint64_t, OpGpuTime> ops = timeline.ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops.at(1).kernel_count, 2u);
  EXPECT_EQ(ops.at(1).first_start_ns, 10u);
  EXPECT_EQ(ops.at(1).last_end_ns, 60u);
  EXPECT_EQ(ops.at(1).busy_ns, 20u);
  EXPECT_EQ(ops.at(2).kernel_count, 1u);
  EXPECT_EQ(ops.at(2).busy_ns, 10u);
}

TEST(cupti_Timeline, UntimedActivityCountsWithoutAnInterval) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{kernel(80, 0, 0), kernel(81, 500, 700)};
  std::vector<ExternalCorrelation> correlations{{80, 6}, {81, 6}};
  timeline.add(activities, correlations);
  OpGpuTime op = *timeline.op(6);
  EXPECT_EQ(op.kernel_count, 2u);
  EXPECT_EQ(op.first_start_ns, 500u);
  EXPECT_EQ(op.busy_ns, 200u);
}

TEST(cupti_Timeline, ClearForgetsOpsCorrelationsAndPending) {
  OpGpuTimeline timeline;
  std::vector<GpuActivity> activities{kernel(90, 1, 2), kernel(91, 1, 2)};
  std::vector<ExternalCorrelation> correlations{{90, 1}};
  timeline.add(activities, correlations);
  timeline.clear();
  EXPECT_TRUE(timeline.ops().empty());
  EXPECT_EQ(timeline.uncorrelated_count(), 0u);
  // The old mapping is gone too: a kernel reusing id 90 is uncorrelated.
  std::vector<GpuActivity> again{kernel(90, 5, 6)};
  timeline.add(again, {});
  EXPECT_EQ(timeline.uncorrelated_count(), 1u);
}

// CUPTI's worker thread adds while an op hook thread reads.
TEST(cupti_Timeline, AddAndReadFromTwoThreads) {
  OpGpuTimeline timeline;
  constexpr std::uint32_t kBuffers = 200;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      for (const auto& [op_id, op] : timeline.ops()) {
        EXPECT_LE(op.first_start_ns, op.last_end_ns);
      }
      (void)timeline.uncorrelated_count();
    }
  });
  for (std::uint32_t i = 0; i < kBuffers; ++i) {
    // Each buffer carries its own kernel and the previous buffer's
    // correlation: every kernel arrives before its correlation record.
    std::uint32_t id = 1000 + i;
    std::vector<GpuActivity> activities{kernel(id, 10 * i + 1, 10 * i + 5)};
    std::vector<ExternalCorrelation> correlations;
    if (i > 0) correlations.push_back({id - 1, (i - 1) % 4});
    timeline.add(activities, correlations);
  }
  std::vector<ExternalCorrelation> last{{1000 + kBuffers - 1, (kBuffers - 1) % 4}};
  timeline.add({}, last);
  done.store(true);
  reader.join();

  EXPECT_EQ(timeline.uncorrelated_count(), 0u);
  std::uint64_t kernels = 0;
  for (const auto& [op_id, op] : timeline.ops()) {
    kernels += op.kernel_count;
    EXPECT_EQ(op.kernel_count, kBuffers / 4);
    EXPECT_EQ(op.busy_ns, 4u * (kBuffers / 4));
  }
  EXPECT_EQ(kernels, kBuffers);
}

}  // namespace
}  // namespace spillway
