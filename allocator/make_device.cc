#include "allocator/make_device.h"

#include "allocator/config/log.h"
#include "allocator/device/sim_device.h"
#if SPILLWAY_HAVE_CUDA
#include "allocator/device/cuda_device.h"
#endif

namespace spillway {

bool cuda_usable(std::string* reason) {
#if SPILLWAY_HAVE_CUDA
  return CudaDevice::probe(reason);
#else
  *reason = "spillway was built without the CUDA backend (no CUDA toolkit at build time)";
  return false;
#endif
}

namespace {

std::unique_ptr<Device> make_sim_device(const Config& config) {
  SimDeviceOptions options;
  options.capacity_bytes = config.sim_capacity;
  options.bandwidth_bytes_per_s = config.sim_bandwidth;
  return std::make_unique<SimDevice>(options);
}

std::unique_ptr<Device> make_cuda_device(std::string* error) {
#if SPILLWAY_HAVE_CUDA
  std::string reason;
  std::unique_ptr<CudaDevice> device;
  if (!CudaDevice::probe(&reason)) {
    *error = "device:cuda: no usable GPU (" + reason + ")";
    return nullptr;
  }
  if (CudaDevice::create(0, &device) != Status::ok) {
    *error = "device:cuda: " + CudaDevice::thread_last_error();
    return nullptr;
  }
  return device;
#else
  *error = "device:cuda: spillway was built without the CUDA backend";
  return nullptr;
#endif
}

}  // namespace

std::unique_ptr<Device> make_device(const Config& config, std::string* error) {
  switch (config.device) {
    case DeviceChoice::sim:
      return make_sim_device(config);
    case DeviceChoice::cuda:
      return make_cuda_device(error);
    case DeviceChoice::auto_select: {
      std::string reason;
      if (cuda_usable(&reason)) return make_cuda_device(error);
      SPILLWAY_LOG(warn, "no usable GPU ({}); using the simulated device (device:sim)", reason);
      return make_sim_device(config);
    }
  }
  *error = "unknown device choice";
  return nullptr;
}

}  // namespace spillway
