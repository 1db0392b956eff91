#include "allocator/chunk/chunk_types.h"

namespace spillway {

std::string_view to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::param:
      return "param";
    case TensorKind::grad:
      return "grad";
    case TensorKind::master:
      return "master";
    case TensorKind::optimizer_state:
      return "optimizer_state";
  }
  return "?";
}

std::string_view to_string(Location location) {
  switch (location) {
    case Location::none:
      return "none";
    case Location::device:
      return "device";
    case Location::host:
      return "host";
  }
  return "?";
}

std::string_view to_string(TensorState state) {
  switch (state) {
    case TensorState::free:
      return "free";
    case TensorState::hold:
      return "hold";
    case TensorState::compute:
      return "compute";
  }
  return "?";
}

}  // namespace spillway
