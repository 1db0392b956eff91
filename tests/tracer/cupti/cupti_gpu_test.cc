// CuptiSource on a real GPU: copies made inside pushed ops come back as
// memcpy activities of those ops, with their bytes. Skipped (not passed)
// without a usable GPU, or when another CUPTI client holds CUPTI.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "allocator/device/cuda_device.h"
#include "tracer/cupti/cupti_source.h"

namespace spillway {
namespace {

TEST(cupti_Gpu, CopiesInsideOpsJoinThoseOps) {
  std::string reason;
  if (!CudaDevice::probe(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;

  OpGpuTimeline timeline;
  CuptiSource source(timeline);
  // Started before the device (and its context) exists, as the runtime will.
  CuptiStartResult started = source.start(CuptiMode::on);
  if (started.message.find("another CUPTI client") != std::string::npos) {
    GTEST_SKIP() << started.message;
  }
  ASSERT_EQ(started.outcome, CuptiOutcome::recording) << started.message;

  std::unique_ptr<CudaDevice> device;
  ASSERT_EQ(CudaDevice::create(0, &device), Status::ok) << CudaDevice::thread_last_error();
  constexpr std::size_t kBytes = 1 << 20;
  void* on_device = nullptr;
  void* on_host = nullptr;
  ASSERT_EQ(device->malloc(&on_device, kBytes), Status::ok);
  ASSERT_EQ(device->host_malloc(&on_host, kBytes), Status::ok);

  source.push_op(41);
  ASSERT_EQ(device->copy_async(on_device, on_host, kBytes, Stream{}), Status::ok);
  source.pop_op();
  source.push_op(42);
  ASSERT_EQ(device->copy_async(on_host, on_device, kBytes / 2, Stream{}), Status::ok);
  ASSERT_EQ(device->copy_async(on_host, on_device, kBytes / 2, Stream{}), Status::ok);
  source.pop_op();
  ASSERT_EQ(device->synchronize(), Status::ok);
  source.flush();

  std::optional<OpGpuTime> upload = timeline.op(41);
  std::optional<OpGpuTime> downloads = timeline.op(42);
  ASSERT_TRUE(upload.has_value());
  ASSERT_TRUE(downloads.has_value());
  EXPECT_EQ(upload->memcpy_count, 1u);
  EXPECT_EQ(upload->memcpy_bytes, kBytes);
  EXPECT_EQ(downloads->memcpy_count, 2u);
  EXPECT_EQ(downloads->memcpy_bytes, kBytes);
  EXPECT_GT(upload->busy_ns, 0u);
  EXPECT_LE(upload->last_end_ns, downloads->first_start_ns);  // one stream: in order

  source.stop();
  EXPECT_EQ(device->free(on_device), Status::ok);
  EXPECT_EQ(device->host_free(on_host), Status::ok);
}

}  // namespace
}  // namespace spillway
