// The conformance suite on CudaDevice. Without a usable GPU (this includes a
// machine with the toolkit but no driver) every test reports as skipped.
#include "allocator/device/cuda_device.h"
#include "conformance.h"

namespace spillway::testing {
namespace {

std::unique_ptr<Device> make_cuda(std::string* skip_reason) {
  if (!CudaDevice::probe(skip_reason)) return nullptr;
  std::unique_ptr<CudaDevice> device;
  if (CudaDevice::create(0, &device) != Status::ok) {
    *skip_reason = "CudaDevice::create(0) failed: " + CudaDevice::thread_last_error();
    return nullptr;
  }
  return device;
}

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceConformance,
                         ::testing::Values(DeviceFactory{"gpu0", make_cuda}),
                         DeviceFactory::test_name);

}  // namespace
}  // namespace spillway::testing
