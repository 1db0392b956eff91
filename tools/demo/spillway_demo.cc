// spillway-demo: what the foundation can do today, end to end.
//
// Reads SPILLWAY_CONF, picks the device it names (the simulated GPU where no
// GPU is usable), then moves a set of "chunks" host -> device -> host through
// two streams ordered by events, the way the chunk manager will, checks every
// byte came back, and prints the copy speed beside the modelled one. The
// training demo replaces this once the LibTorch bridge exists.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "allocator/config.h"
#include "allocator/log.h"
#include "allocator/make_device.h"

namespace spillway {
namespace {

struct DemoOptions {
  int chunks = 8;
  std::size_t chunk_bytes = std::size_t{16} << 20;
  int rounds = 4;
};

bool check(Device& device, Status status, const char* what) {
  if (status == Status::ok) return true;
  fmt::print(stderr, "spillway-demo: {} failed: {} ({})\n", what, to_string(status),
             device.last_error());
  return false;
}

int run_demo(const Config& config, const DemoOptions& demo) {
  std::string error;
  std::unique_ptr<Device> device = make_device(config, &error);
  if (!device) {
    fmt::print(stderr, "spillway-demo: {}\n", error);
    return 1;
  }
  MemoryInfo memory;
  if (!check(*device, device->memory_info(&memory), "memory_info")) return 1;
  fmt::print("device: {}, {:.2f} of {:.2f} GiB free\n", device->name(),
             memory.free_bytes / double(1 << 30), memory.total_bytes / double(1 << 30));

  // Host copies of the chunks (pinned) and one device slot per chunk.
  const std::size_t bytes = demo.chunk_bytes;
  std::vector<void*> host(demo.chunks), back(demo.chunks), slots(demo.chunks);
  std::mt19937_64 rng(42);
  for (int i = 0; i < demo.chunks; ++i) {
    if (!check(*device, device->host_malloc(&host[i], bytes), "host_malloc") ||
        !check(*device, device->host_malloc(&back[i], bytes), "host_malloc") ||
        !check(*device, device->malloc(&slots[i], bytes), "malloc")) {
      return 1;
    }
    auto* words = static_cast<std::uint64_t*>(host[i]);
    for (std::size_t w = 0; w < bytes / 8; ++w) words[w] = rng();
  }

  Stream upload, download;
  Event uploaded;
  if (!check(*device, device->create_stream(&upload), "create_stream") ||
      !check(*device, device->create_stream(&download), "create_stream") ||
      !check(*device, device->create_event(&uploaded), "create_event")) {
    return 1;
  }
  const std::uint64_t start = device->now_ns();
  for (int round = 0; round < demo.rounds; ++round) {
    for (int i = 0; i < demo.chunks; ++i) {
      // Fetch on one stream, write back on the other once the fetch is done.
      if (!check(*device, device->copy_async(slots[i], host[i], bytes, upload), "copy h2d") ||
          !check(*device, device->record_event(uploaded, upload), "record_event") ||
          !check(*device, device->wait_event(download, uploaded), "wait_event") ||
          !check(*device, device->copy_async(back[i], slots[i], bytes, download), "copy d2h")) {
        return 1;
      }
    }
  }
  if (!check(*device, device->synchronize(), "synchronize")) return 1;
  const double seconds = (device->now_ns() - start) / 1e9;

  int mismatched = 0;
  for (int i = 0; i < demo.chunks; ++i) mismatched += std::memcmp(host[i], back[i], bytes) != 0;
  const double moved = 2.0 * demo.rounds * demo.chunks * bytes;
  fmt::print(
      "moved {} chunks of {:.1f} MiB {} times each way: {:.2f} GB in {:.3f} s ({:.2f} GB/s)\n",
      demo.chunks, bytes / double(1 << 20), demo.rounds, moved / 1e9, seconds,
      moved / 1e9 / seconds);
  if (device->kind() == DeviceKind::sim && config.sim_bandwidth > 0) {
    fmt::print("modelled bandwidth {:.2f} GB/s per direction\n", config.sim_bandwidth / 1e9);
  }
  fmt::print("chunks bit-identical after the round trips: {}\n", mismatched == 0 ? "yes" : "NO");

  device->destroy_event(uploaded);
  device->destroy_stream(upload);
  device->destroy_stream(download);
  for (int i = 0; i < demo.chunks; ++i) {
    device->host_free(host[i]);
    device->host_free(back[i]);
    device->free(slots[i]);
  }
  return mismatched == 0 ? 0 : 1;
}

}  // namespace
}  // namespace spillway

int main(int argc, char** argv) {
  CLI::App app{"spillway-demo: moves chunks through the configured device (SPILLWAY_CONF)"};
  spillway::DemoOptions demo;
  app.add_option("--chunks", demo.chunks, "number of chunks")->check(CLI::Range(1, 4096));
  int chunk_mib = 16;
  app.add_option("--chunk-mib", chunk_mib, "chunk size in MiB")->check(CLI::Range(1, 4096));
  app.add_option("--rounds", demo.rounds, "round trips per chunk")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  demo.chunk_bytes = static_cast<std::size_t>(chunk_mib) << 20;

  spillway::ConfigResult parsed = spillway::config_from_environment();
  if (!parsed.ok()) {
    fmt::print(stderr, "{}\n", parsed.error->message);
    return 2;
  }
  spillway::set_log_level(parsed.config->log);
  fmt::print("SPILLWAY_CONF: {}\n", spillway::format_config(*parsed.config));
  return spillway::run_demo(*parsed.config, demo);
}
