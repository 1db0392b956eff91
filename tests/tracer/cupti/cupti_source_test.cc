// CuptiSource against a stand-in for CUPTI (CuptiCalls): what start() does
// in each mode and on each failure, that push_op/pop_op reach CUPTI's
// correlation stack, that buffers CUPTI completes reach the timeline, and
// that stop() gives everything back. No GPU needed.
#include "tracer/cupti/cupti_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace spillway {
namespace {

// Records go into a buffer as fixed-size slots; next_record walks them.
constexpr std::size_t kSlotBytes = (sizeof(CUpti_ActivityKernel10) + 7) / 8 * 8;

// The stand-in's state. CUPTI's callbacks carry no user data, so neither
// can the stand-in's: one process-wide instance, reset by the fixture.
struct FakeCupti {
  CUptiResult subscribe_result = CUPTI_SUCCESS;
  CUpti_ActivityKind failing_kind = CUPTI_ACTIVITY_KIND_INVALID;
  CUptiResult enable_failure = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES;
  bool driver = true;

  int calls = 0;  // of any entry point
  bool subscribed = false;
  CUpti_BuffersCallbackRequestFunc buffer_requested = nullptr;
  CUpti_BuffersCallbackCompleteFunc buffer_completed = nullptr;
  std::vector<CUpti_ActivityKind> enabled;
  std::vector<std::uint64_t> id_stack;                     // CUSTOM0, this thread
  std::vector<std::vector<std::uint8_t>> pending_records;  // one record each
  std::uint32_t next_correlation_id = 1;
  std::vector<std::uint32_t> flush_flags;
};
FakeCupti fake;

// What CUPTI does on a kernel launch inside pushed ranges: an external
// correlation record for the innermost id, then (later) the kernel record.
template <typename Record>
void queue(const Record& record) {
  std::vector<std::uint8_t> bytes(kSlotBytes, 0);
  std::memcpy(bytes.data(), &record, sizeof record);
  fake.pending_records.push_back(std::move(bytes));
}

void launch_kernel(std::uint64_t start, std::uint64_t end) {
  std::uint32_t correlation_id = fake.next_correlation_id++;
  bool recording = std::find(fake.enabled.begin(), fake.enabled.end(),
                             CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != fake.enabled.end();
  if (!recording) return;
  if (!fake.id_stack.empty()) {
    CUpti_ActivityExternalCorrelation correlation{};
    correlation.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    correlation.externalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
    correlation.externalId = fake.id_stack.back();
    correlation.correlationId = correlation_id;
    queue(correlation);
  }
  CUpti_ActivityAPI api{};
  api.kind = CUPTI_ACTIVITY_KIND_RUNTIME;
  api.correlationId = correlation_id;
  queue(api);
  CUpti_ActivityKernel10 kernel{};
  kernel.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  kernel.correlationId = correlation_id;
  kernel.start = start;
  kernel.end = end;
  queue(kernel);
}

// Hands the queued records to the source as CUPTI would: one buffer it
// asked for, filled, completed.
void complete_buffer() {
  std::uint8_t* buffer = nullptr;
  std::size_t size = 0;
  std::size_t max_records = 0;
  fake.buffer_requested(&buffer, &size, &max_records);
  ASSERT_NE(buffer, nullptr);
  ASSERT_GE(size, fake.pending_records.size() * kSlotBytes);
  std::size_t valid = 0;
  for (const auto& record : fake.pending_records) {
    std::memcpy(buffer + valid, record.data(), kSlotBytes);
    valid += kSlotBytes;
  }
  fake.pending_records.clear();
  fake.buffer_completed(nullptr, 0, buffer, size, valid);
}

const CuptiCalls fake_calls{
    .subscribe =
        [](CUpti_SubscriberHandle* handle, CUpti_CallbackFunc, void*) {
          ++fake.calls;
          if (fake.subscribe_result != CUPTI_SUCCESS) return fake.subscribe_result;
          if (fake.subscribed) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
          fake.subscribed = true;
          *handle = reinterpret_cast<CUpti_SubscriberHandle>(&fake);
          return CUPTI_SUCCESS;
        },
    .unsubscribe =
        [](CUpti_SubscriberHandle) {
          ++fake.calls;
          fake.subscribed = false;
          return CUPTI_SUCCESS;
        },
    .register_callbacks =
        [](CUpti_BuffersCallbackRequestFunc requested,
           CUpti_BuffersCallbackCompleteFunc completed) {
          ++fake.calls;
          fake.buffer_requested = requested;
          fake.buffer_completed = completed;
          return CUPTI_SUCCESS;
        },
    .enable =
        [](CUpti_ActivityKind kind) {
          ++fake.calls;
          if (kind == fake.failing_kind) return fake.enable_failure;
          fake.enabled.push_back(kind);
          return CUPTI_SUCCESS;
        },
    .disable =
        [](CUpti_ActivityKind kind) {
          ++fake.calls;
          std::erase(fake.enabled, kind);
          return CUPTI_SUCCESS;
        },
    .push_external_id =
        [](CUpti_ExternalCorrelationKind kind, std::uint64_t id) {
          ++fake.calls;
          if (kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) return CUPTI_ERROR_INVALID_PARAMETER;
          fake.id_stack.push_back(id);
          return CUPTI_SUCCESS;
        },
    .pop_external_id =
        [](CUpti_ExternalCorrelationKind kind, std::uint64_t* last) {
          ++fake.calls;
          if (kind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 || fake.id_stack.empty()) {
            return CUPTI_ERROR_INVALID_PARAMETER;
          }
          *last = fake.id_stack.back();
          fake.id_stack.pop_back();
          return CUPTI_SUCCESS;
        },
    .flush_all =
        [](std::uint32_t flag) {
          ++fake.calls;
          fake.flush_flags.push_back(flag);
          if (!fake.pending_records.empty()) complete_buffer();
          return CUPTI_SUCCESS;
        },
    .next_record =
        [](std::uint8_t* buffer, std::size_t valid, CUpti_Activity** record) {
          std::size_t offset = *record == nullptr
                                   ? 0
                                   : reinterpret_cast<std::uint8_t*>(*record) - buffer + kSlotBytes;
          if (offset + kSlotBytes > valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
          *record = reinterpret_cast<CUpti_Activity*>(buffer + offset);
          return CUPTI_SUCCESS;
        },
    .result_string =
        [](CUptiResult result, const char** text) {
          *text = result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                      ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
                  : result == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES
                      ? "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"
                  : result == CUPTI_ERROR_UNKNOWN ? "CUPTI_ERROR_UNKNOWN"
                                                  : "other";
          return CUPTI_SUCCESS;
        },
    .driver_loadable = [] { return fake.driver; },
};

class cupti_Source : public ::testing::Test {
 protected:
  void SetUp() override { fake = FakeCupti{}; }
  OpGpuTimeline timeline_;
};

TEST_F(cupti_Source, OffTouchesNothing) {
  CuptiSource source(timeline_, fake_calls);
  ::testing::internal::CaptureStderr();
  CuptiStartResult result = source.start(CuptiMode::off);
  source.push_op(1);
  source.pop_op();
  source.flush();
  source.stop();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(result.outcome, CuptiOutcome::off);
  EXPECT_TRUE(result.ok());
  EXPECT_FALSE(source.recording());
  EXPECT_EQ(fake.calls, 0);
}

// The source logs nothing; the hooks warn (op_gpu_timing.h).
TEST_F(cupti_Source, AutoWithAnotherSubscriberFallsBackSayingWhy) {
  fake.subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  CuptiSource first(timeline_, fake_calls);
  CuptiSource second(timeline_, fake_calls);
  ::testing::internal::CaptureStderr();
  CuptiStartResult a = first.start(CuptiMode::auto_select);
  CuptiStartResult b = first.start(CuptiMode::auto_select);
  CuptiStartResult c = second.start(CuptiMode::auto_select);
  std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(log, "");
  for (const CuptiStartResult& result : {a, b, c}) {
    EXPECT_EQ(result.outcome, CuptiOutcome::wall_clock);
    EXPECT_TRUE(result.ok());
    EXPECT_NE(result.message.find("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"),
              std::string::npos);
    EXPECT_NE(result.message.find("another CUPTI client holds it"), std::string::npos)
        << result.message;
    EXPECT_NE(result.message.find("falls back to the wall clock"), std::string::npos)
        << result.message;
  }
  EXPECT_FALSE(first.recording());
  // It stopped at the subscriber: no activity kind of the other client's
  // session was touched, and push_op does not reach CUPTI.
  EXPECT_TRUE(fake.enabled.empty());
  EXPECT_EQ(fake.buffer_completed, nullptr);
  first.push_op(3);
  EXPECT_TRUE(fake.id_stack.empty());
}

TEST_F(cupti_Source, OnWithAnotherSubscriberIsAnErrorSayingWhy) {
  fake.subscribe_result = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  CuptiSource source(timeline_, fake_calls);
  ::testing::internal::CaptureStderr();
  CuptiStartResult result = source.start(CuptiMode::on);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // the caller reports it
  EXPECT_EQ(result.outcome, CuptiOutcome::failed);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.message,
            "cupti:on, but CUPTI cannot be used: cuptiSubscribe returned "
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: another CUPTI client holds it (the "
            "PyTorch profiler, Nsight Systems or Compute, cuda-gdb)");
}

TEST_F(cupti_Source, WithoutADriverTheMessageSaysSo) {
  fake.subscribe_result = CUPTI_ERROR_UNKNOWN;
  fake.driver = false;
  CuptiSource source(timeline_, fake_calls);
  CuptiStartResult result = source.start(CuptiMode::on);
  EXPECT_NE(result.message.find("CUPTI_ERROR_UNKNOWN: no CUDA driver"), std::string::npos)
      << result.message;
}

TEST_F(cupti_Source, AFailedEnableUndoesWhatStartDid) {
  fake.failing_kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  CuptiSource source(timeline_, fake_calls);
  ::testing::internal::CaptureStderr();
  CuptiStartResult result = source.start(CuptiMode::auto_select);
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(result.outcome, CuptiOutcome::wall_clock);
  EXPECT_NE(result.message.find("cuptiActivityEnable returned CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"),
            std::string::npos)
      << result.message;
  EXPECT_NE(result.message.find("restricted to administrators"), std::string::npos);
  EXPECT_EQ(log, "");
  EXPECT_TRUE(fake.enabled.empty());  // the kinds enabled before the failure are off again
  EXPECT_FALSE(fake.subscribed);      // and CUPTI is free for another client
  EXPECT_FALSE(source.recording());
}

TEST_F(cupti_Source, RecordsKernelsOfNestedOpsIntoTheTimeline) {
  CuptiSource source(timeline_, fake_calls);
  ASSERT_EQ(source.start(CuptiMode::on).outcome, CuptiOutcome::recording);
  EXPECT_TRUE(source.recording());
  EXPECT_EQ(source.start(CuptiMode::on).outcome, CuptiOutcome::recording);  // again: no-op
  EXPECT_EQ(fake.enabled.size(), 5u);

  source.push_op(1);
  launch_kernel(100, 200);
  source.push_op(2);
  launch_kernel(210, 260);
  EXPECT_EQ(fake.id_stack, (std::vector<std::uint64_t>{1, 2}));
  source.pop_op();
  launch_kernel(300, 400);
  source.pop_op();
  EXPECT_TRUE(fake.id_stack.empty());
  launch_kernel(500, 600);  // outside any op

  source.flush();
  EXPECT_EQ(fake.flush_flags, (std::vector<std::uint32_t>{0}));
  std::map<std::uint64_t, OpGpuTime> ops = timeline_.ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops.at(1).kernel_count, 2u);
  EXPECT_EQ(ops.at(1).first_start_ns, 100u);
  EXPECT_EQ(ops.at(1).last_end_ns, 400u);
  EXPECT_EQ(ops.at(1).busy_ns, 200u);
  EXPECT_EQ(ops.at(2).kernel_count, 1u);
  EXPECT_EQ(ops.at(2).busy_ns, 50u);
  EXPECT_EQ(timeline_.uncorrelated_count(), 1u);
  EXPECT_EQ(source.ignored_records(), 4u);  // the runtime API records
}

TEST_F(cupti_Source, StopHandsBackTheRestAndReleasesCupti) {
  CuptiSource source(timeline_, fake_calls);
  ASSERT_EQ(source.start(CuptiMode::auto_select).outcome, CuptiOutcome::recording);
  source.push_op(7);
  launch_kernel(10, 20);
  source.pop_op();
  source.stop();

  EXPECT_EQ(fake.flush_flags, (std::vector<std::uint32_t>{CUPTI_ACTIVITY_FLAG_FLUSH_FORCED}));
  ASSERT_TRUE(timeline_.op(7).has_value());
  EXPECT_EQ(timeline_.op(7)->kernel_count, 1u);
  EXPECT_TRUE(fake.enabled.empty());
  EXPECT_FALSE(fake.subscribed);
  EXPECT_FALSE(source.recording());

  // A buffer CUPTI completes after stop() is freed, not added.
  fake.enabled.push_back(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  fake.id_stack.push_back(8);
  launch_kernel(30, 40);
  complete_buffer();
  EXPECT_FALSE(timeline_.op(8).has_value());

  // And pushes after stop() do not reach CUPTI.
  fake.id_stack.clear();
  source.push_op(9);
  EXPECT_TRUE(fake.id_stack.empty());
}

TEST_F(cupti_Source, OneSourceRecordsAtATime) {
  CuptiSource first(timeline_, fake_calls);
  ASSERT_EQ(first.start(CuptiMode::auto_select).outcome, CuptiOutcome::recording);
  OpGpuTimeline other_timeline;
  CuptiSource second(other_timeline, fake_calls);
  CuptiStartResult result = second.start(CuptiMode::on);
  EXPECT_EQ(result.outcome, CuptiOutcome::failed);
  EXPECT_NE(result.message.find("another spillway CUPTI source is recording"), std::string::npos);
  EXPECT_TRUE(first.recording());

  first.stop();
  EXPECT_EQ(second.start(CuptiMode::on).outcome, CuptiOutcome::recording);
}

}  // namespace
}  // namespace spillway
