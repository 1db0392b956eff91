// The conformance suite on SimDevice: instant copies, and modelled
// bandwidth with latency and injected copy delay (so every ordering test also
// runs with copies slow enough that a missing wait would read stale bytes).
#include "allocator/device/sim_device.h"
#include "conformance.h"

namespace spillway::testing {
namespace {

std::unique_ptr<Device> make_instant_sim(std::string*) { return std::make_unique<SimDevice>(); }

std::unique_ptr<Device> make_modelled_sim(std::string*) {
  SimDeviceOptions options;
  options.capacity_bytes = std::size_t{1} << 30;
  options.bandwidth_bytes_per_s = 20e9;
  options.copy_latency_ns = 10'000;
  auto device = std::make_unique<SimDevice>(options);
  device->set_copy_delay_ns(200'000);
  return device;
}

INSTANTIATE_TEST_SUITE_P(Sim, DeviceConformance,
                         ::testing::Values(DeviceFactory{"instant", make_instant_sim},
                                           DeviceFactory{"modelled", make_modelled_sim}),
                         DeviceFactory::test_name);

}  // namespace
}  // namespace spillway::testing
