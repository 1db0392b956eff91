// Uses the installed headers and library: parses a configuration, makes the
// device it names, and copies bytes through it.
#include <cstdio>
#include <cstring>

#include "allocator/config/config.h"
#include "allocator/make_device.h"

int main() {
  spillway::ConfigResult parsed = spillway::parse_config("device:sim,sim_capacity:64MB");
  if (!parsed.ok()) return std::puts(parsed.error->message.c_str()), 1;
  std::string error;
  auto device = spillway::make_device(*parsed.config, &error);
  if (!device) return std::puts(error.c_str()), 1;
  char in[64] = "installed spillway works", out[64] = {};
  void* block = nullptr;
  if (device->malloc(&block, sizeof in) != spillway::Status::ok) return 1;
  device->copy_async(block, in, sizeof in, {});
  device->copy_async(out, block, sizeof in, {});
  device->synchronize();
  device->free(block);
  std::puts(out);
  return std::strcmp(in, out) == 0 ? 0 : 1;
}
