// The Device conformance suite: one set of tests that every Device
// implementation must pass (RMM's pattern). A backend's test program
// instantiates it with factories for that backend:
//
//   INSTANTIATE_TEST_SUITE_P(Sim, DeviceConformance,
//                            testing::Values(DeviceFactory{"instant", make_sim}),
//                            DeviceFactory::test_name);
//
// A factory that cannot make its device (no GPU) gives a reason, and every
// test of that instance reports as skipped with it, never as passed.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "allocator/device/device.h"

namespace spillway::testing {

struct DeviceFactory {
  std::string name;
  // The device, or null with *skip_reason set.
  std::function<std::unique_ptr<Device>(std::string* skip_reason)> make;

  static std::string test_name(const ::testing::TestParamInfo<DeviceFactory>& info) {
    return info.param.name;
  }
};

// gtest prints a parameter in test listings; the name is what matters.
inline void PrintTo(const DeviceFactory& factory, std::ostream* out) { *out << factory.name; }

class DeviceConformance : public ::testing::TestWithParam<DeviceFactory> {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::unique_ptr<Device> device_;
};

}  // namespace spillway::testing
