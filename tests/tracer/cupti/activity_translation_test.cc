// Activity translation on hand-made CUPTI records: the real structs of the
// CUPTI headers, zeroed and filled field by field, as CUPTI would write them.
// Then records through translation and timeline together, in both orders.
#include "tracer/cupti/activity_translation.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tracer/cupti/op_gpu_timeline.h"

namespace spillway {
namespace {

template <typename Record>
Record zeroed() {
  Record record;
  std::memset(&record, 0, sizeof record);
  return record;
}

const CUpti_Activity& as_activity(const auto& record) {
  return reinterpret_cast<const CUpti_Activity&>(record);
}

CUpti_ActivityKernel10 kernel_record(std::uint32_t correlation_id, std::uint64_t start,
                                     std::uint64_t end) {
  auto record = zeroed<CUpti_ActivityKernel10>();
  record.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  record.correlationId = correlation_id;
  record.start = start;
  record.end = end;
  record.streamId = 13;
  record.deviceId = 1;
  return record;
}

CUpti_ActivityMemcpy6 memcpy_record(std::uint32_t correlation_id, std::uint8_t copy_kind,
                                    std::uint64_t bytes) {
  auto record = zeroed<CUpti_ActivityMemcpy6>();
  record.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  record.copyKind = copy_kind;
  record.bytes = bytes;
  record.start = 1000;
  record.end = 3000;
  record.correlationId = correlation_id;
  record.runtimeCorrelationId = correlation_id - 1;
  record.streamId = 21;
  record.deviceId = 2;
  return record;
}

CUpti_ActivityExternalCorrelation correlation_record(
    std::uint32_t correlation_id, std::uint64_t external_id,
    CUpti_ExternalCorrelationKind kind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
  auto record = zeroed<CUpti_ActivityExternalCorrelation>();
  record.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  record.externalKind = kind;
  record.correlationId = correlation_id;
  record.externalId = external_id;
  return record;
}

TEST(cupti_Translation, ConcurrentKernel) {
  TranslatedActivities out;
  translate_activity(as_activity(kernel_record(77, 5'000, 9'000)), out);
  ASSERT_EQ(out.activities.size(), 1u);
  const GpuActivity& kernel = out.activities[0];
  EXPECT_EQ(kernel.kind, GpuActivityKind::kernel);
  EXPECT_EQ(kernel.start_ns, 5'000u);
  EXPECT_EQ(kernel.end_ns, 9'000u);
  EXPECT_EQ(kernel.correlation_id, 77u);
  EXPECT_EQ(kernel.runtime_correlation_id, 0u);
  EXPECT_EQ(kernel.stream_id, 13u);
  EXPECT_EQ(kernel.device_id, 1u);
  EXPECT_EQ(kernel.bytes, 0u);
  EXPECT_EQ(kernel.direction, CopyDirection::none);
  EXPECT_TRUE(out.correlations.empty());
  EXPECT_EQ(out.ignored_records, 0u);
}

TEST(cupti_Translation, SerializedKernelKindHasTheSameLayout) {
  auto record = kernel_record(78, 1, 2);
  record.kind = CUPTI_ACTIVITY_KIND_KERNEL;
  TranslatedActivities out;
  translate_activity(as_activity(record), out);
  ASSERT_EQ(out.activities.size(), 1u);
  EXPECT_EQ(out.activities[0].correlation_id, 78u);
}

TEST(cupti_Translation, MemcpyBytesDirectionAndBothCorrelationIds) {
  TranslatedActivities out;
  translate_activity(as_activity(memcpy_record(101, CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, 1 << 20)),
                     out);
  translate_activity(as_activity(memcpy_record(201, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, 512)), out);
  ASSERT_EQ(out.activities.size(), 2u);

  const GpuActivity& upload = out.activities[0];
  EXPECT_EQ(upload.kind, GpuActivityKind::memcpy);
  EXPECT_EQ(upload.bytes, 1u << 20);
  EXPECT_EQ(upload.direction, CopyDirection::host_to_device);
  EXPECT_EQ(upload.start_ns, 1000u);
  EXPECT_EQ(upload.end_ns, 3000u);
  EXPECT_EQ(upload.correlation_id, 101u);
  EXPECT_EQ(upload.runtime_correlation_id, 100u);
  EXPECT_EQ(upload.stream_id, 21u);
  EXPECT_EQ(upload.device_id, 2u);

  EXPECT_EQ(out.activities[1].direction, CopyDirection::device_to_host);
  EXPECT_EQ(out.activities[1].bytes, 512u);
}

TEST(cupti_Translation, EveryCopyKindHasADirection) {
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD), CopyDirection::host_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_HTOA), CopyDirection::host_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH), CopyDirection::device_to_host);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_ATOH), CopyDirection::device_to_host);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD), CopyDirection::device_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_DTOA), CopyDirection::device_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_ATOD), CopyDirection::device_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_ATOA), CopyDirection::device_to_device);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_HTOH), CopyDirection::host_to_host);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_PTOP), CopyDirection::peer_to_peer);
  EXPECT_EQ(copy_direction(CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN), CopyDirection::none);
  EXPECT_EQ(copy_direction(200), CopyDirection::none);
}

TEST(cupti_Translation, ExternalCorrelationOfTheOpHooksKind) {
  TranslatedActivities out;
  translate_activity(as_activity(correlation_record(55, 123456789012ull)), out);
  ASSERT_EQ(out.correlations.size(), 1u);
  EXPECT_EQ(out.correlations[0], (ExternalCorrelation{55, 123456789012ull}));
  EXPECT_TRUE(out.activities.empty());
  EXPECT_EQ(out.ignored_records, 0u);
}

TEST(cupti_Translation, OtherExternalKindsAreIgnored) {
  TranslatedActivities out;
  translate_activity(
      as_activity(correlation_record(56, 1, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1)), out);
  translate_activity(
      as_activity(correlation_record(57, 2, CUPTI_EXTERNAL_CORRELATION_KIND_OPENACC)), out);
  EXPECT_TRUE(out.correlations.empty());
  EXPECT_EQ(out.ignored_records, 2u);
}

TEST(cupti_Translation, UnusedKindsAreCountedAndIgnored) {
  TranslatedActivities out;
  auto runtime = zeroed<CUpti_ActivityAPI>();
  runtime.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  runtime.correlationId = 9;
  auto driver = runtime;
  driver.kind = CUPTI_ACTIVITY_KIND_DRIVER;
  auto memset = zeroed<CUpti_ActivityMemset4>();
  memset.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  translate_activity(as_activity(runtime), out);
  translate_activity(as_activity(driver), out);
  translate_activity(as_activity(memset), out);
  EXPECT_TRUE(out.activities.empty());
  EXPECT_TRUE(out.correlations.empty());
  EXPECT_EQ(out.ignored_records, 3u);
}

// Records -> translation -> timeline, one "buffer" at a time.
void add_buffer(OpGpuTimeline& timeline, const std::vector<const CUpti_Activity*>& buffer) {
  TranslatedActivities translated;
  for (const CUpti_Activity* record : buffer) translate_activity(*record, translated);
  timeline.add(translated.activities, translated.correlations);
}

TEST(cupti_Translation, RecordsJoinTheirOpInEitherArrivalOrder) {
  auto k1 = kernel_record(300, 100, 200);
  auto k2 = kernel_record(301, 250, 400);
  auto copy = memcpy_record(303, CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, 2048);
  auto c1 = correlation_record(300, 17);
  auto c2 = correlation_record(301, 17);
  auto c3 = correlation_record(/*runtime id of the copy*/ 302, 18);

  OpGpuTimeline correlations_first;
  add_buffer(correlations_first, {&as_activity(c1), &as_activity(c2), &as_activity(c3)});
  add_buffer(correlations_first, {&as_activity(k1), &as_activity(k2), &as_activity(copy)});

  OpGpuTimeline activities_first;
  add_buffer(activities_first, {&as_activity(k1), &as_activity(copy)});
  add_buffer(activities_first, {&as_activity(c3), &as_activity(k2), &as_activity(c2)});
  EXPECT_EQ(activities_first.uncorrelated_count(), 1u);  // k1's record has not come
  add_buffer(activities_first, {&as_activity(c1)});

  for (const OpGpuTimeline* timeline : {&correlations_first, &activities_first}) {
    std::map<std::uint64_t, OpGpuTime> ops = timeline->ops();
    ASSERT_EQ(ops.size(), 2u);
    EXPECT_EQ(ops.at(17).kernel_count, 2u);
    EXPECT_EQ(ops.at(17).first_start_ns, 100u);
    EXPECT_EQ(ops.at(17).last_end_ns, 400u);
    EXPECT_EQ(ops.at(17).busy_ns, 100u + 150u);
    EXPECT_EQ(ops.at(18).memcpy_count, 1u);
    EXPECT_EQ(ops.at(18).memcpy_bytes, 2048u);
    EXPECT_EQ(timeline->uncorrelated_count(), 0u);
  }
}

}  // namespace
}  // namespace spillway
