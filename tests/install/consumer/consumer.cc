// A user's program on the installed C ABI (allocator/spillway.h, the one
// header installed beside libspillway.so): configures the simulated device,
// allocates, writes and reads the block (the simulated device's memory is host
// memory, docs/device.md), checks the statistics and the errors, frees.
#include <cstdio>
#include <cstring>
#include <string>

#include "allocator/spillway.h"

namespace {

int failed(const char* what) {
  std::printf("consumer: %s (spillway_last_error: %s)\n", what, spillway_last_error());
  return 1;
}

std::string stats_json() {
  std::string json(spillway_stats_json(nullptr, 0), '\0');
  spillway_stats_json(json.data(), json.size() + 1);
  return json;
}

// One figure of the statistics (a flat JSON object of numbers), -1 when absent.
long long figure(const std::string& key) {
  const std::string json = stats_json();
  const std::string quoted = "\"" + key + "\":";
  const size_t at = json.find(quoted);
  return at == std::string::npos ? -1 : std::stoll(json.substr(at + quoted.size()));
}

}  // namespace

int main() {
  const char* conf = "device:sim,sim_capacity:64MiB,device_budget:0.5";
  if (spillway_configure("device:sim,bogus:1") == 0) return failed("an unknown key was accepted");
  if (std::strstr(spillway_last_error(), "bogus") == nullptr)
    return failed("the error names no key");
  if (spillway_configure(conf) != 0) return failed("spillway_configure");

  constexpr size_t kBytes = 1 << 20;
  void* block = spillway_malloc(kBytes, 0, nullptr);
  if (block == nullptr) return failed("spillway_malloc");
  char text[] = "installed spillway works";
  std::memset(block, 0, kBytes);
  std::memcpy(static_cast<char*>(block) + kBytes - sizeof text, text, sizeof text);
  if (std::strcmp(static_cast<const char*>(block) + kBytes - sizeof text, text) != 0) {
    return failed("the block does not hold what was written");
  }
  if (figure("allocated_bytes.all.current") != static_cast<long long>(kBytes)) {
    return failed(("the statistics miss the allocation: " + stats_json()).c_str());
  }
  if (spillway_malloc(kBytes, 1, nullptr) != nullptr) return failed("device 1 gave memory");
  if (spillway_configure("device:sim,sim_capacity:128MiB") == 0) {
    return failed("an active spillway took another configuration");
  }
  spillway_free(block, kBytes, 0, nullptr);
  if (figure("allocated_bytes.all.current") != 0) return failed("the free is not counted");
  spillway_empty_cache();
  std::puts(text);
  return 0;
}
