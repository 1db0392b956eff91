// ReportModel on traces built in memory: every total checked against numbers
// worked out by hand from the events (synthetic_traces.h).
#include "tools/report/report_model.h"

#include <gtest/gtest.h>

#include <limits>

#include "tests/report/synthetic_traces.h"
#include "tools/report/recommendations.h"
#include "tools/report/summary_text.h"

namespace spillway::report {
namespace {

using K = TraceEventKind;

TEST(ReportModel, SmallV2TraceTotals) {
  const ReportModel model = build_report_model(testing::small_v2_trace());
  const ReportTotals& t = model.totals;
  EXPECT_EQ(model.format_version, 2u);
  EXPECT_TRUE(model.has_chunk_events);
  EXPECT_EQ(t.event_count, 18u);
  EXPECT_EQ(t.duration_ns, 1200u);
  // allocated: 1024, 3072, 3584 (peak), 2560, 3584, 3072.
  EXPECT_EQ(t.peak_allocated_bytes, 3584u);
  EXPECT_EQ(t.peak_reserved_bytes, 4096u);
  // model: chunk 1 (1024) + chunk 2 (2048); the refetch of resident chunk 2 adds nothing.
  EXPECT_EQ(t.peak_model_bytes, 3072u);
  // non-model: the 512-byte activation.
  EXPECT_EQ(t.peak_non_model_bytes, 512u);
  EXPECT_EQ(t.model_size_bytes, 3072u);
  // Chunk fill: chunk 1 copies 1000 of its 1024 bytes, chunk 2 2000 of 2048.
  EXPECT_EQ(t.fetched_chunk_capacity_bytes, 3072u);
  EXPECT_EQ(t.fetched_chunk_used_bytes, 3000u);
  EXPECT_DOUBLE_EQ(t.chunk_fill_ratio(), 3000.0 / 3072.0);
  EXPECT_EQ(t.bytes_h2d, 6000u);
  EXPECT_EQ(t.bytes_d2h, 800u);
  EXPECT_EQ(t.fetches, 4u);
  EXPECT_EQ(t.prefetches, 1u);
  EXPECT_EQ(t.writebacks, 1u);
  EXPECT_EQ(t.drops, 1u);
  EXPECT_EQ(t.evictions, 1u);
  EXPECT_EQ(t.stalls, 2u);
  EXPECT_EQ(t.stall_ns, 200u);
  EXPECT_EQ(t.ooms, 1u);
  EXPECT_EQ(t.largest_oom_request_bytes, 8192u);
  EXPECT_EQ(t.steps, 2u);
  EXPECT_EQ(t.unmatched_frees, 0u);
  ASSERT_TRUE(model.device_budget_bytes.has_value());
  EXPECT_EQ(*model.device_budget_bytes, 1000000u);
  ASSERT_EQ(model.steps.size(), 2u);
  EXPECT_EQ(model.steps[1].step, 2u);
  EXPECT_EQ(model.steps[1].time_ns, 2200u);
}

TEST(ReportModel, SmallV2TracePerClient) {
  const ReportModel model = build_report_model(testing::small_v2_trace());
  ASSERT_EQ(model.clients.size(), 2u);
  const ClientActivity& first = model.clients[0];
  EXPECT_EQ(first.client, 0u);
  EXPECT_EQ(first.bytes_h2d, 2000u);
  EXPECT_EQ(first.bytes_d2h, 800u);
  EXPECT_EQ(first.fetches, 2u);
  EXPECT_EQ(first.prefetches, 0u);
  EXPECT_EQ(first.evictions, 1u);
  EXPECT_EQ(first.stall_ns, 150u);
  EXPECT_EQ(first.peak_resident_bytes, 1024u);
  EXPECT_EQ(first.chunk_bytes, 1024u);
  // Resident: nothing, chunk 1, evicted, fetched again.
  ASSERT_EQ(first.residency.size(), 4u);
  EXPECT_EQ(first.residency[0].time_ns, 1000u);
  EXPECT_EQ(first.residency[0].resident_bytes, 0u);
  EXPECT_EQ(first.residency[1].resident_bytes, 1024u);
  EXPECT_EQ(first.residency[2].time_ns, 1700u);
  EXPECT_EQ(first.residency[2].resident_bytes, 0u);
  EXPECT_EQ(first.residency[3].resident_bytes, 1024u);

  const ClientActivity& second = model.clients[1];
  EXPECT_EQ(second.client, 1u);
  EXPECT_EQ(second.bytes_h2d, 4000u);
  EXPECT_EQ(second.bytes_d2h, 0u);
  EXPECT_EQ(second.fetches, 2u);
  EXPECT_EQ(second.prefetches, 1u);
  EXPECT_EQ(second.evictions, 0u);
  EXPECT_EQ(second.stall_ns, 50u);
  EXPECT_EQ(second.peak_resident_bytes, 2048u);
}

TEST(ReportModel, MemorySamplesSplitModelAndNonModel) {
  const ReportModel model = build_report_model(testing::small_v2_trace());
  // The first sample, then one per event that changed a byte count, a chunk
  // move's alloc or free counting with its fetch or drop: the segment, 3
  // fetches of new copies, the activation's alloc and free, 1 drop.
  ASSERT_EQ(model.memory.size(), 8u);
  EXPECT_EQ(model.memory.front().allocated_bytes, 0u);
  const MemorySample& after_activation = model.memory[4];
  EXPECT_EQ(after_activation.time_ns, 1300u);
  EXPECT_EQ(after_activation.allocated_bytes, 3584u);
  EXPECT_EQ(after_activation.model_bytes, 3072u);
  EXPECT_EQ(after_activation.non_model_bytes(), 512u);
  for (const MemorySample& sample : model.memory)
    EXPECT_LE(sample.model_bytes, sample.allocated_bytes) << "at " << sample.time_ns;
  EXPECT_EQ(model.memory.back().allocated_bytes, 3072u);
}

// Allocator events only, as every version 1 file has, through the file
// encoder and the validating reader.
TEST(ReportModel, AllocatorOnlyTraceFromEncodedBytes) {
  const TraceMetadata metadata = {{"device_budget_bytes", "100000"}};
  const std::vector<TraceEvent> events = {
      {10, K::segment_alloc, 0, 0x1000, 8192},
      {20, K::alloc, 0, 0x1000, 3000},
      {30, K::alloc, 0, 0x2000, 1000},
      {40, K::free, 0, 0x1000, 3000},
      {50, K::oom, 0, 0, 70000},
      {60, K::oom, 0, 0, 90000},
  };
  const TraceReadResult read = parse_trace(encode_trace(metadata, events));
  ASSERT_TRUE(read.ok()) << read.error;
  const ReportModel model = build_report_model(*read.trace);
  EXPECT_EQ(model.format_version, read.trace->format_version);
  EXPECT_FALSE(model.has_chunk_events);
  EXPECT_TRUE(model.clients.empty());
  EXPECT_EQ(model.totals.peak_allocated_bytes, 4000u);
  EXPECT_EQ(model.totals.peak_reserved_bytes, 8192u);
  EXPECT_EQ(model.totals.peak_model_bytes, 0u);
  EXPECT_EQ(model.totals.peak_non_model_bytes, 4000u);
  EXPECT_EQ(model.totals.ooms, 2u);
  EXPECT_EQ(model.totals.largest_oom_request_bytes, 90000u);
  EXPECT_EQ(model.totals.duration_ns, 50u);
  EXPECT_EQ(model.totals.steps, 0u);
}

// Chunk events survive the file round trip (the writer's current version)
// and give the same model as the in-memory trace.
TEST(ReportModel, VersionTwoTraceThroughTheFileFormat) {
  if (kTraceFormatVersion < 2) GTEST_SKIP() << "the trace writer does not write version 2 yet";
  const TraceFileContents original = testing::small_v2_trace();
  const TraceReadResult read = parse_trace(encode_trace(original.metadata, original.events));
  ASSERT_TRUE(read.ok()) << read.error;
  const ReportModel model = build_report_model(*read.trace);
  const ReportModel expected = build_report_model(original);
  EXPECT_TRUE(model.has_chunk_events);
  EXPECT_EQ(model.totals.peak_model_bytes, expected.totals.peak_model_bytes);
  EXPECT_EQ(model.totals.peak_non_model_bytes, expected.totals.peak_non_model_bytes);
  EXPECT_EQ(model.totals.bytes_h2d, expected.totals.bytes_h2d);
  EXPECT_EQ(model.totals.evictions, expected.totals.evictions);
  EXPECT_EQ(model.totals.stall_ns, expected.totals.stall_ns);
  EXPECT_EQ(model.totals.steps, expected.totals.steps);
  ASSERT_EQ(model.clients.size(), 2u);
  EXPECT_EQ(model.clients[1].prefetches, 1u);
}

TEST(ReportModel, FreesWithoutAllocsDoNotWrap) {
  TraceFileContents trace;
  trace.format_version = 1;
  trace.events = {{10, K::free, 0, 0x1000, 500}, {20, K::alloc, 0, 0x2000, 100}};
  const ReportModel model = build_report_model(trace);
  EXPECT_EQ(model.totals.unmatched_frees, 1u);
  EXPECT_EQ(model.totals.peak_allocated_bytes, 100u);
}

// Corrupt sizes (a trace cut short carries no CRC over its records) stop the
// sums at the largest value: wrapped, two stalls of 2^64-1 ns would read as
// a plausible 2^64-2.
TEST(ReportModel, SumsOfCorruptSizesStopAtTheLargestValueInsteadOfWrapping) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  TraceFileContents trace;
  trace.format_version = 2;
  trace.events = {{10, K::stall, 0, 4, kMax, 0, 1},
                  {20, K::stall, 0, 4, kMax, 0, 1},
                  {30, K::alloc, 0, 0x1000, kMax},
                  {40, K::alloc, 0, 0x2000, 100},
                  {50, K::chunk_fetch, 2097152, 4, kMax, 0, 1},
                  {60, K::chunk_writeback, 0, 4, kMax, 0, 1},
                  {70, K::chunk_writeback, 0, 4, 5, 0, 1}};
  const ReportModel model = build_report_model(trace);
  EXPECT_EQ(model.totals.stalls, 2u);
  EXPECT_EQ(model.totals.stall_ns, kMax);
  ASSERT_EQ(model.clients.size(), 1u);
  EXPECT_EQ(model.clients[0].stall_ns, kMax);
  EXPECT_EQ(model.totals.peak_allocated_bytes, kMax);
  EXPECT_EQ(model.totals.bytes_h2d, kMax);
  EXPECT_EQ(model.totals.bytes_d2h, kMax);
  std::uint64_t bucket_stall = 0;
  for (const TrafficBucket& bucket : traffic_buckets(model, 1)) bucket_stall = bucket.stall_ns;
  EXPECT_EQ(bucket_stall, kMax);
}

TEST(ReportModel, EmptyTrace) {
  EXPECT_EQ(ReportTotals{}.chunk_fill_ratio(), 0.0);  // no chunk fetched
  TraceFileContents trace;
  trace.format_version = 1;
  const ReportModel model = build_report_model(trace);
  EXPECT_EQ(model.totals.event_count, 0u);
  EXPECT_EQ(model.totals.duration_ns, 0u);
  EXPECT_EQ(model.memory.size(), 1u);
  EXPECT_FALSE(recommendations(model).empty());
}

TEST(TrafficBuckets, SumToTheTotals) {
  const ReportModel model = build_report_model(testing::demo_v2_trace());
  const std::vector<TrafficBucket> buckets = traffic_buckets(model, 100);
  ASSERT_EQ(buckets.size(), 100u);
  std::uint64_t h2d = 0, d2h = 0, stall = 0;
  for (const TrafficBucket& bucket : buckets) {
    h2d += bucket.bytes_h2d;
    d2h += bucket.bytes_d2h;
    stall += bucket.stall_ns;
  }
  EXPECT_EQ(h2d, model.totals.bytes_h2d);
  EXPECT_EQ(d2h, model.totals.bytes_d2h);
  EXPECT_EQ(stall, model.totals.stall_ns);
  EXPECT_EQ(buckets.back().end_ns, model.totals.duration_ns);
}

TEST(Recommendations, DerivedFromTheNumbers) {
  const std::vector<std::string> sentences =
      recommendations(build_report_model(testing::small_v2_trace()));
  // Out-of-memory (1, 8192 bytes) and stalls (200 ns of 1200 ns); no
  // fragmentation (4096 / 3584 = 1.14) and the budget rule is off after an OOM.
  ASSERT_EQ(sentences.size(), 2u);
  EXPECT_NE(sentences[0].find("1 time;"), std::string::npos) << sentences[0];
  EXPECT_NE(sentences[0].find("8.00 KiB (8192 bytes)"), std::string::npos) << sentences[0];
  EXPECT_NE(sentences[1].find("17% of the traced time"), std::string::npos) << sentences[1];
}

TEST(Recommendations, LowBudgetUseAndFragmentation) {
  TraceFileContents trace;
  trace.format_version = 1;
  trace.metadata = {{"device_budget_bytes", "1000000"}, {"chunk_size_bytes", "65536"}};
  trace.events = {{10, K::segment_alloc, 0, 0x1000, 65536}, {20, K::alloc, 0, 0x1000, 1000}};
  const std::vector<std::string> sentences = recommendations(build_report_model(trace));
  ASSERT_EQ(sentences.size(), 2u);
  EXPECT_NE(sentences[0].find("7% of the device budget"), std::string::npos) << sentences[0];
  EXPECT_NE(sentences[1].find("65.54x peak allocated"), std::string::npos) << sentences[1];
  EXPECT_NE(sentences[1].find("chunk_size (now 64.00 KiB)"), std::string::npos) << sentences[1];
}

// The chunk manager's real order: the device copy's alloc, then the fetch;
// the free, then the drop. The copy never reads as non-model data.
TEST(ReportModel, ChunkDeviceCopiesAreNeverNonModelBytes) {
  TraceFileContents trace;
  trace.format_version = 2;
  trace.events = {
      {100, K::alloc, 0, 0xA000, 4096},
      {100, K::chunk_fetch, 4096, 1, 4096, 0, 0},
      {200, K::alloc, 0, 0xB000, 512},  // an activation
      {300, K::free, 0, 0xB000, 512},
      {400, K::free, 0, 0xA000, 4096},
      {400, K::chunk_drop, 4096, 1, 4096, kTraceDetailEviction, 0},
      {500, K::alloc, 0, 0xA000, 4096},
      {500, K::chunk_fetch, 4096, 2, 4096, 0, 0},
  };
  const ReportModel model = build_report_model(trace);
  EXPECT_EQ(model.totals.peak_non_model_bytes, 512u);
  EXPECT_EQ(model.totals.peak_allocated_bytes, 4608u);
  EXPECT_EQ(model.totals.peak_model_bytes, 4096u);
  for (const MemorySample& sample : model.memory) {
    EXPECT_EQ(sample.model_bytes + sample.non_model_bytes(), sample.allocated_bytes)
        << "at " << sample.time_ns;
  }
}

// Version 4: spills for allocations, budget overruns and the smallest budget
// are counted, and an overrun is a recommendation that quotes the budget to set.
TEST(ReportModel, VersionFourSpillsOverrunsAndTheSmallestBudget) {
  TraceFileContents trace;
  trace.format_version = 4;
  trace.metadata = {{"device_budget_bytes", "4096"}};
  trace.events = {
      {100, K::alloc, 0, 0xA000, 4096},
      {100, K::chunk_fetch, 4096, 1, 4096, 0, 0},
      {150, K::min_budget, 0, 0, 4096},
      {200, K::budget_overrun, 4096, 2, 4096, 0, 0},
      {200, K::alloc, 0, 0xB000, 4096},
      {200, K::chunk_fetch, 4096, 2, 4096, 0, 0},
      {210, K::min_budget, 0, 0, 8192},
      {300, K::free, 0, 0xB000, 4096},
      {300, K::chunk_drop, 4096, 2, 4096, kTraceDetailEviction, 0},
      {400, K::alloc, 0, 0xC000, 1024},
      {400, K::spill_for_allocation, 0, 0xC000, 1024},
  };
  const ReportModel model = build_report_model(trace);
  EXPECT_EQ(model.totals.spills_for_allocation, 1u);
  EXPECT_EQ(model.totals.budget_overruns, 1u);
  EXPECT_EQ(model.totals.largest_overrun_bytes, 4096u);
  EXPECT_EQ(model.totals.min_budget_bytes, 8192u);
  EXPECT_EQ(model.totals.ooms, 0u);
  const std::vector<std::string> sentences = recommendations(model);
  ASSERT_FALSE(sentences.empty());
  EXPECT_NE(sentences[0].find("1 time, so they were made resident past it (by up to 4.00 KiB)"),
            std::string::npos)
      << sentences[0];
  EXPECT_NE(sentences[0].find("smallest budget (8.00 KiB)"), std::string::npos) << sentences[0];
}

// Note [Prefetch timed by op durations]: each step's measured stall (its
// stall events) beside the one the copy model expected (the step's size).
TEST(ReportModel, StallPerStepMeasuredAndExpected) {
  TraceFileContents trace;
  trace.format_version = 4;
  trace.events = {
      {100, K::stall, 0, 1, 3'000'000, 0, 0}, {200, K::stall, 0, 2, 2'000'000, 0, 0},
      {300, K::step, 0, 1, 4'500'000},        {400, K::step, 0, 2, 0},
      {500, K::stall, 0, 1, 700'000, 0, 0},   {600, K::step, 0, 3, 600'000},
  };
  const ReportModel model = build_report_model(trace);
  ASSERT_EQ(model.steps.size(), 3u);
  EXPECT_EQ(model.steps[0].stall_ns, 5'000'000u);
  EXPECT_EQ(model.steps[0].expected_stall_ns, 4'500'000u);
  EXPECT_EQ(model.steps[1].stall_ns, 0u);
  EXPECT_EQ(model.steps[1].expected_stall_ns, 0u);
  EXPECT_EQ(model.steps[2].stall_ns, 700'000u);
  EXPECT_EQ(model.steps[2].expected_stall_ns, 600'000u);
  const std::string text = summary_text(model, "t.trace");
  EXPECT_NE(text.find("stall per step (ms, measured/expected by the copy model): 5.000/4.500, "
                      "0.000/0.000, 0.700/0.600"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace spillway::report
