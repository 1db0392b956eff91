// CuptiSource on the real libcupti where CUDA cannot be used (CI, a machine
// with the toolkit but no driver): `auto` falls back to the wall clock saying
// why however often it starts (the hooks warn, once), `on` fails saying why, `off` says
// nothing. Skipped where a GPU is usable (cupti_gpu_test.cc covers that).
#include <gtest/gtest.h>

#include <string>

#include "allocator/make_device.h"
#include "tracer/cupti/cupti_source.h"

namespace spillway {
namespace {

class cupti_Fallback : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (cuda_usable(&reason)) GTEST_SKIP() << "a GPU is usable here: CUPTI does not fall back";
  }
  OpGpuTimeline timeline_;
};

TEST_F(cupti_Fallback, AutoFallsBackSayingWhyAcrossStarts) {
  CuptiSource first(timeline_);
  CuptiSource second(timeline_);
  ::testing::internal::CaptureStderr();
  CuptiStartResult a = first.start(CuptiMode::auto_select);
  CuptiStartResult b = first.start(CuptiMode::auto_select);
  CuptiStartResult c = second.start(CuptiMode::auto_select);
  first.push_op(1);  // harmless when not recording
  first.pop_op();
  first.flush();
  std::string log = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(log, "");  // the source says why in its result; the hooks log it
  for (const CuptiStartResult& result : {a, b, c}) {
    EXPECT_EQ(result.outcome, CuptiOutcome::wall_clock);
    EXPECT_TRUE(result.ok());
    EXPECT_EQ(result.message.rfind("CUPTI cannot be used (cuptiSubscribe returned", 0), 0u)
        << result.message;
    EXPECT_NE(result.message.find("op timing falls back to the wall clock"), std::string::npos)
        << result.message;
  }
  EXPECT_FALSE(first.recording());
  EXPECT_TRUE(timeline_.ops().empty());
}

TEST_F(cupti_Fallback, OnFailsSayingWhy) {
  CuptiSource source(timeline_);
  ::testing::internal::CaptureStderr();
  CuptiStartResult result = source.start(CuptiMode::on);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(result.outcome, CuptiOutcome::failed);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.message.rfind("cupti:on, but CUPTI cannot be used: cuptiSubscribe returned ", 0),
            0u)
      << result.message;
  if (!real_cupti_calls().driver_loadable()) {
    EXPECT_NE(result.message.find("no CUDA driver (libcuda.so.1 cannot be loaded)"),
              std::string::npos)
        << result.message;
  }
}

TEST_F(cupti_Fallback, OffSaysNothing) {
  CuptiSource source(timeline_);
  ::testing::internal::CaptureStderr();
  CuptiStartResult result = source.start(CuptiMode::off);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(result.outcome, CuptiOutcome::off);
  EXPECT_FALSE(source.recording());
}

}  // namespace
}  // namespace spillway
