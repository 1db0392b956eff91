// Device benchmark bodies; see device_benchmarks.h for what each measures.
// A failing device call ends the benchmark with SkipWithError, which
// MetricReporter turns into "# error: ..." and a non-zero exit.
#include "bench/device/device_benchmarks.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "bench/common/metric_reporter.h"

namespace spillway::bench {
namespace {

void no_op(void*) {}

std::string describe_failure(const char* call, Status status, const Device& device) {
  std::string text = std::string(call) + ": " + std::string(to_string(status));
  const std::string detail = device.last_error();
  if (!detail.empty()) text += " (" + detail + ")";
  return text;
}

// Ends the benchmark on the first failing call; returns false then.
bool ok_or_skip(benchmark::State& state, const Device& device, const char* call, Status status) {
  if (status == Status::ok) return true;
  state.SkipWithError(describe_failure(call, status, device).c_str());
  return false;
}

}  // namespace

std::unique_ptr<DeviceFixture> DeviceFixture::create(Device& device, std::size_t copy_bytes,
                                                     std::string* error) {
  std::unique_ptr<DeviceFixture> fixture(new DeviceFixture(device, copy_bytes));
  auto check = [&](const char* call, Status status) {
    if (status != Status::ok) *error = describe_failure(call, status, device);
    return status == Status::ok;
  };
  if (!check("malloc", device.malloc(&fixture->device_buffer_, copy_bytes)) ||
      !check("host_malloc", device.host_malloc(&fixture->host_buffer_, copy_bytes)) ||
      !check("create_stream", device.create_stream(&fixture->stream_a_)) ||
      !check("create_stream", device.create_stream(&fixture->stream_b_)) ||
      !check("create_event", device.create_event(&fixture->event_a_)) ||
      !check("create_event", device.create_event(&fixture->event_b_))) {
    return nullptr;  // the destructor releases what was made
  }
  std::memset(fixture->host_buffer_, 0x5A, copy_bytes);
  const Stream stream = fixture->stream_a_;
  if (!check("copy_async", device.copy_async(fixture->device_buffer_, fixture->host_buffer_,
                                             copy_bytes, stream)) ||
      !check("copy_async", device.copy_async(fixture->host_buffer_, fixture->device_buffer_,
                                             copy_bytes, stream)) ||
      !check("synchronize_stream", device.synchronize_stream(stream))) {
    return nullptr;
  }
  return fixture;
}

DeviceFixture::~DeviceFixture() {
  // Best effort: a benchmark that failed may have left work queued.
  (void)device_.synchronize();
  if (event_b_ != Event{}) (void)device_.destroy_event(event_b_);
  if (event_a_ != Event{}) (void)device_.destroy_event(event_a_);
  if (stream_b_ != Stream{}) (void)device_.destroy_stream(stream_b_);
  if (stream_a_ != Stream{}) (void)device_.destroy_stream(stream_a_);
  if (host_buffer_ != nullptr) (void)device_.host_free(host_buffer_);
  if (device_buffer_ != nullptr) (void)device_.free(device_buffer_);
}

void run_copy_benchmark(benchmark::State& state, DeviceFixture& fixture,
                        const CopyBenchmark& spec) {
  Device& device = fixture.device();
  const std::size_t bytes = fixture.copy_bytes();
  const bool to_device = spec.direction == CopyDirection::host_to_device;
  void* dst = to_device ? fixture.device_buffer() : fixture.host_buffer();
  const void* src = to_device ? fixture.host_buffer() : fixture.device_buffer();
  const Stream stream = fixture.stream_a();

  const std::uint64_t start_ns = device.now_ns();
  for (auto _ : state) {
    if (!ok_or_skip(state, device, "copy_async", device.copy_async(dst, src, bytes, stream)) ||
        !ok_or_skip(state, device, "synchronize_stream", device.synchronize_stream(stream))) {
      return;
    }
  }
  const std::uint64_t elapsed_ns = device.now_ns() - start_ns;
  const double copied = static_cast<double>(bytes) * static_cast<double>(state.iterations());
  const double bytes_per_s = copied * 1e9 / static_cast<double>(elapsed_ns ? elapsed_ns : 1);

  state.SetBytesProcessed(static_cast<std::int64_t>(copied));
  state.counters[metric_counter(spec.throughput_metric, "GB/s")] = bytes_per_s / 1e9;
  if (spec.modelled_bytes_per_s > 0) {
    state.counters[metric_counter(spec.ratio_metric, "ratio")] =
        bytes_per_s / spec.modelled_bytes_per_s;
  }
}

void run_event_roundtrip_benchmark(benchmark::State& state, DeviceFixture& fixture,
                                   bool behind_host_function, const std::string& metric) {
  Device& device = fixture.device();
  const Stream stream = fixture.stream_a();
  const Event event = fixture.event_a();
  if (!ok_or_skip(state, device, "synchronize_stream", device.synchronize_stream(stream))) return;

  const std::uint64_t start_ns = device.now_ns();
  for (auto _ : state) {
    if (behind_host_function && !ok_or_skip(state, device, "launch_host_function",
                                            device.launch_host_function(stream, no_op, nullptr))) {
      return;
    }
    if (!ok_or_skip(state, device, "record_event", device.record_event(event, stream)) ||
        !ok_or_skip(state, device, "synchronize_event", device.synchronize_event(event))) {
      return;
    }
  }
  const std::uint64_t elapsed_ns = device.now_ns() - start_ns;
  state.counters[metric_counter(metric, "ns")] =
      static_cast<double>(elapsed_ns) / static_cast<double>(state.iterations());
}

void run_cross_stream_event_benchmark(benchmark::State& state, DeviceFixture& fixture,
                                      bool behind_host_function, const std::string& metric) {
  Device& device = fixture.device();
  const Stream a = fixture.stream_a();
  const Stream b = fixture.stream_b();
  const Event event_a = fixture.event_a();
  const Event event_b = fixture.event_b();
  if (!ok_or_skip(state, device, "synchronize", device.synchronize())) return;

  const std::uint64_t start_ns = device.now_ns();
  for (auto _ : state) {
    if (behind_host_function && !ok_or_skip(state, device, "launch_host_function",
                                            device.launch_host_function(a, no_op, nullptr))) {
      return;
    }
    if (!ok_or_skip(state, device, "record_event", device.record_event(event_a, a)) ||
        !ok_or_skip(state, device, "wait_event", device.wait_event(b, event_a)) ||
        !ok_or_skip(state, device, "record_event", device.record_event(event_b, b)) ||
        !ok_or_skip(state, device, "synchronize_event", device.synchronize_event(event_b))) {
      return;
    }
  }
  const std::uint64_t elapsed_ns = device.now_ns() - start_ns;
  state.counters[metric_counter(metric, "ns")] =
      static_cast<double>(elapsed_ns) / static_cast<double>(state.iterations());
}

}  // namespace spillway::bench
