#include "allocator/device/device.h"

namespace spillway {

std::string_view to_string(Status status) {
  switch (status) {
    case Status::ok:
      return "ok";
    case Status::not_ready:
      return "not ready";
    case Status::out_of_memory:
      return "out of memory";
    case Status::invalid_argument:
      return "invalid argument";
    case Status::unavailable:
      return "unavailable";
    case Status::injected_fault:
      return "injected fault";
    case Status::error:
      return "error";
  }
  return "unknown status";
}

std::string_view to_string(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cuda:
      return "cuda";
    case DeviceKind::sim:
      return "sim";
  }
  return "unknown device";
}

}  // namespace spillway
