// Device selection from the configuration: `device:cuda`, `device:sim`, or
// `device:auto` (cuda when a GPU is usable, else sim with one warning).
#pragma once

#include <memory>
#include <string>

#include "allocator/config/config.h"
#include "allocator/device/device.h"

namespace spillway {

// The device the configuration asks for, or null with *error saying why
// (e.g. `device:cuda` on a machine whose driver is missing).
std::unique_ptr<Device> make_device(const Config& config, std::string* error);

// True when this build has the CUDA backend and a GPU is usable; otherwise
// false with *reason saying why (not built, no driver, no device).
bool cuda_usable(std::string* reason);

}  // namespace spillway
