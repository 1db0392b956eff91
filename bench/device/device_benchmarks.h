// Benchmark bodies for the device seam, written once against Device so the
// same measurement runs on SimDevice and CudaDevice (bench_device.cc chooses
// the devices and names the metrics).
//
// What is measured, and why that way:
//  - copy throughput: one copy_async of the whole buffer, then
//    synchronize_stream, per iteration; bytes copied over wall time. This is
//    what a chunk move costs the chunk manager, start to finish.
//  - event round trip: record_event + synchronize_event on a stream with
//    nothing queued; optionally behind a no-op host function, which makes the
//    event wait for one trip through the stream (on SimDevice an event on an
//    idle stream is complete at once, so without it no worker is involved).
//  - cross-stream event: record on stream A, wait_event on B, record on B,
//    synchronize B's event: the latency of one stream-to-stream dependency, as
//    when a copy stream's chunk fetch gates the compute stream. Optionally
//    with a no-op host function queued on A first, so that B's wait is real.
// Times come from Device::now_ns() around the benchmark loop (wall time: the
// work runs on other threads or on the GPU, not on the timing thread).
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <memory>
#include <string>

#include "allocator/device/device.h"

namespace spillway::bench {

// Buffers, streams and events one device's benchmarks share, made once so
// that allocation and pinning stay out of the measurements.
class DeviceFixture {
 public:
  // Allocates `copy_bytes` of device and of pinned host memory, two streams
  // and two events, and runs one warm-up copy each way (page faults, lazy
  // mappings). Null with *error set when any of it fails.
  static std::unique_ptr<DeviceFixture> create(Device& device, std::size_t copy_bytes,
                                               std::string* error);
  ~DeviceFixture();
  DeviceFixture(const DeviceFixture&) = delete;
  DeviceFixture& operator=(const DeviceFixture&) = delete;

  Device& device() { return device_; }
  std::size_t copy_bytes() const { return copy_bytes_; }
  void* device_buffer() { return device_buffer_; }
  void* host_buffer() { return host_buffer_; }
  Stream stream_a() const { return stream_a_; }
  Stream stream_b() const { return stream_b_; }
  Event event_a() const { return event_a_; }
  Event event_b() const { return event_b_; }

 private:
  DeviceFixture(Device& device, std::size_t copy_bytes)
      : device_(device), copy_bytes_(copy_bytes) {}

  Device& device_;
  const std::size_t copy_bytes_;
  void* device_buffer_ = nullptr;
  void* host_buffer_ = nullptr;
  Stream stream_a_;
  Stream stream_b_;
  Event event_a_;
  Event event_b_;
};

enum class CopyDirection { host_to_device, device_to_host };

struct CopyBenchmark {
  CopyDirection direction = CopyDirection::host_to_device;
  std::string throughput_metric;  // reported in GB/s (1e9 bytes per second)
  // When > 0, also report achieved / modelled bandwidth as ratio_metric.
  double modelled_bytes_per_s = 0;
  std::string ratio_metric;
};

// Copies the fixture's whole buffer per iteration on stream A.
void run_copy_benchmark(benchmark::State& state, DeviceFixture& fixture, const CopyBenchmark& spec);

// record + synchronize of event A on idle stream A; reported in ns.
// behind_host_function: queue a no-op host function first.
void run_event_roundtrip_benchmark(benchmark::State& state, DeviceFixture& fixture,
                                   bool behind_host_function, const std::string& metric);

// A records, B waits and records, host synchronizes B's event; in ns.
void run_cross_stream_event_benchmark(benchmark::State& state, DeviceFixture& fixture,
                                      bool behind_host_function, const std::string& metric);

}  // namespace spillway::bench
