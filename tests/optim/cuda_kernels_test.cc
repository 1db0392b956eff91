// The CUDA optimizer kernels against the CPU kernels: the same random
// parameters, gradients (fp32, bf16, fp16) and state, several steps, with and
// without a low-precision parameter copy written back. Prints the max
// relative difference per case; the kernels use the same roundings, so it is
// expected to be 0, and asserted to be at most 1e-6. Needs a GPU: without a
// usable one (no driver, as on the build machines) every case is skipped.
// Device memory and copies go through CudaDevice (the device seam), so this
// file includes no CUDA headers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "allocator/device/cuda_device.h"
#include "hooks/optim/cpu_kernels.h"
#include "hooks/optim/cuda_kernels.h"

namespace spillway::optim {
namespace {

using cpu::DType;

constexpr std::size_t kCount = 1'000'003;  // not a multiple of any block size
constexpr int kSteps = 5;

struct KernelCase {
  const char* name;
  bool sgd;
  bool decoupled;  // AdamW
  DType grad_dtype;
  bool write_low;  // a bf16/fp16 copy of the parameters, as for mixed precision
};

std::string case_name(const KernelCase& c) { return c.name; }
void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

// Device buffers owned for the test, freed through the device.
class DeviceBuffer {
 public:
  DeviceBuffer(Device& device, std::size_t bytes) : device_(device) {
    if (device.malloc(&data_, bytes) != Status::ok) data_ = nullptr;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) device_.free(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }

 private:
  Device& device_;
  void* data_ = nullptr;
};

class CudaKernelParity : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    std::string reason;
    if (!CudaDevice::probe(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
    if (!cuda::device_available(&reason)) GTEST_SKIP() << "no usable GPU: " << reason;
    if (CudaDevice::create(0, &device_) != Status::ok)
      GTEST_SKIP() << "CudaDevice::create(0) failed: " << CudaDevice::thread_last_error();
  }
  std::unique_ptr<CudaDevice> device_;
};

std::vector<std::uint16_t> to_low(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint16_t> low(values.size());
  cpu::convert_from_float(values.data(), low.data(), dtype, values.size());
  return low;
}

TEST_P(CudaKernelParity, MatchesTheCpuKernel) {
  const KernelCase& c = GetParam();
  Device& device = *device_;
  std::mt19937 random(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(kCount);
  for (float& p : params) p = normal(random);
  std::vector<float> state0(kCount, 0.0f);
  std::vector<float> state1(kCount, 0.0f);
  const DType low_dtype = c.grad_dtype == DType::f16 ? DType::f16 : DType::bf16;
  std::vector<std::uint16_t> low(kCount, 0);

  const std::size_t grad_bytes = kCount * cpu::dtype_size(c.grad_dtype);
  const std::size_t float_bytes = kCount * sizeof(float);
  DeviceBuffer d_params(device, float_bytes), d_grads(device, grad_bytes),
      d_state0(device, float_bytes), d_state1(device, float_bytes),
      d_low(device, kCount * sizeof(std::uint16_t));
  ASSERT_TRUE(d_params.get() && d_grads.get() && d_state0.get() && d_state1.get() && d_low.get());
  const Stream stream{};
  ASSERT_EQ(device.copy_async(d_params.get(), params.data(), float_bytes, stream), Status::ok);
  ASSERT_EQ(device.copy_async(d_state0.get(), state0.data(), float_bytes, stream), Status::ok);
  ASSERT_EQ(device.copy_async(d_state1.get(), state1.data(), float_bytes, stream), Status::ok);

  double worst = 0;
  std::vector<float> from_device(kCount);
  std::vector<std::uint16_t> low_from_device(kCount);
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> grads32(kCount);
    for (float& g : grads32) g = 0.1f * normal(random);
    std::vector<std::uint16_t> grads16;
    const void* grads = grads32.data();
    if (c.grad_dtype != DType::f32) {
      grads16 = to_low(grads32, c.grad_dtype);
      grads = grads16.data();
    }
    ASSERT_EQ(device.copy_async(d_grads.get(), grads, grad_bytes, stream), Status::ok);
    std::string error;
    if (c.sgd) {
      const cpu::SgdConfig config{0.05, 0.9, 0.1, false, 1e-4, step == 1, 0.5f};
      cpu::SgdArrays host{kCount,       params.data(), grads,
                          c.grad_dtype, state0.data(), c.write_low ? low.data() : nullptr,
                          low_dtype};
      cpu::sgd_step(host, config);
      cpu::SgdArrays on_device{
          kCount,       static_cast<float*>(d_params.get()), d_grads.get(),
          c.grad_dtype, static_cast<float*>(d_state0.get()), c.write_low ? d_low.get() : nullptr,
          low_dtype};
      ASSERT_TRUE(cuda::sgd_step(on_device, config, stream.handle, &error)) << error;
    } else {
      cpu::AdamConfig config;
      config.lr = 1e-3;
      config.weight_decay = 1e-2;
      config.decoupled_weight_decay = c.decoupled;
      config.step = step;
      config.grad_scale = 0.5f;
      cpu::AdamArrays host{kCount,
                           params.data(),
                           grads,
                           c.grad_dtype,
                           state0.data(),
                           state1.data(),
                           c.write_low ? low.data() : nullptr,
                           low_dtype};
      cpu::adam_step(host, config);
      cpu::AdamArrays on_device{kCount,
                                static_cast<float*>(d_params.get()),
                                d_grads.get(),
                                c.grad_dtype,
                                static_cast<float*>(d_state0.get()),
                                static_cast<float*>(d_state1.get()),
                                c.write_low ? d_low.get() : nullptr,
                                low_dtype};
      ASSERT_TRUE(cuda::adam_step(on_device, config, stream.handle, &error)) << error;
    }
    ASSERT_EQ(device.copy_async(from_device.data(), d_params.get(), float_bytes, stream),
              Status::ok);
    if (c.write_low)
      ASSERT_EQ(device.copy_async(low_from_device.data(), d_low.get(),
                                  kCount * sizeof(std::uint16_t), stream),
                Status::ok);
    ASSERT_EQ(device.synchronize_stream(stream), Status::ok) << device.last_error();
    for (std::size_t i = 0; i < kCount; ++i) {
      const double difference = std::fabs(double{from_device[i]} - double{params[i]});
      worst = std::max(worst, difference / std::max(std::fabs(double{params[i]}), 1e-3));
    }
    if (c.write_low) {
      EXPECT_EQ(std::memcmp(low_from_device.data(), low.data(), kCount * sizeof(std::uint16_t)), 0)
          << "the low-precision copy differs at step " << step;
    }
  }
  std::printf("CUDA vs CPU kernel, %s, %d steps of %zu elements: max relative difference %.3g\n",
              c.name, kSteps, kCount, worst);
  RecordProperty("max_relative_difference", std::to_string(worst));
  EXPECT_LE(worst, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, CudaKernelParity,
    ::testing::Values(KernelCase{"Adam_f32", false, false, DType::f32, false},
                      KernelCase{"AdamW_f32", false, true, DType::f32, false},
                      KernelCase{"AdamW_bf16_master", false, true, DType::bf16, true},
                      KernelCase{"Adam_f16_master", false, false, DType::f16, true},
                      KernelCase{"SGD_f32", true, false, DType::f32, false},
                      KernelCase{"SGD_bf16_master", true, false, DType::bf16, true}),
    [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace spillway::optim
