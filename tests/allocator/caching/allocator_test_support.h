// Helpers for the caching allocator tests: a Device decorator that counts
// what reaches the device, a gate that holds a stream busy until opened, and
// a trace sink that keeps every event.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/device.h"
#include "allocator/device/sim_device.h"
#include "tests/support/recording_trace_sink.h"
#include "tracer/trace_event.h"

namespace spillway::testing {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

inline SimDeviceOptions sim_options(std::size_t capacity_bytes) {
  SimDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  return options;
}

inline CachingAllocatorOptions allocator_options(std::size_t budget_bytes,
                                                 std::size_t large_slab_bytes = 8 * MiB) {
  CachingAllocatorOptions options;
  options.budget_bytes = budget_bytes;
  options.large_slab_bytes = large_slab_bytes;
  return options;
}

// Forwards to another device and keeps its own tally of device mallocs and
// frees: an account of reserved memory kept independently of the allocator.
// Can also make every device malloc fail, for as long as a test wants.
class CountingDevice final : public Device {
 public:
  explicit CountingDevice(Device& inner) : inner_(inner) {}

  // Every malloc from now on returns `status` (ok: back to normal).
  void fail_mallocs_with(Status status) {
    std::lock_guard lock(mutex_);
    malloc_failure_ = status;
  }

  struct Tally {
    std::int64_t mallocs = 0;
    std::int64_t frees = 0;
    std::int64_t current_bytes = 0;
    std::int64_t peak_bytes = 0;
    std::int64_t allocated_bytes = 0;
    std::int64_t freed_bytes = 0;
  };
  Tally tally() const {
    std::lock_guard lock(mutex_);
    return tally_;
  }
  // What a stats peak reset does to the tally.
  void reset_peak() {
    std::lock_guard lock(mutex_);
    tally_.peak_bytes = tally_.current_bytes;
  }

 private:
  DeviceKind do_kind() const override { return inner_.kind(); }
  std::string do_name() const override { return "counting " + inner_.name(); }
  Status do_malloc(void** ptr, std::size_t bytes) override {
    {
      std::lock_guard lock(mutex_);
      if (malloc_failure_ != Status::ok) {
        *ptr = nullptr;
        return malloc_failure_;
      }
    }
    const Status status = inner_.malloc(ptr, bytes);
    if (status == Status::ok) {
      std::lock_guard lock(mutex_);
      sizes_.push_back({*ptr, bytes});
      ++tally_.mallocs;
      tally_.current_bytes += static_cast<std::int64_t>(bytes);
      tally_.allocated_bytes += static_cast<std::int64_t>(bytes);
      tally_.peak_bytes = std::max(tally_.peak_bytes, tally_.current_bytes);
    }
    return status;
  }
  Status do_free(void* ptr) override {
    {
      std::lock_guard lock(mutex_);
      for (auto it = sizes_.begin(); it != sizes_.end(); ++it) {
        if (it->first != ptr) continue;
        ++tally_.frees;
        tally_.current_bytes -= static_cast<std::int64_t>(it->second);
        tally_.freed_bytes += static_cast<std::int64_t>(it->second);
        sizes_.erase(it);
        break;
      }
    }
    return inner_.free(ptr);
  }
  Status do_host_malloc(void** ptr, std::size_t bytes) override {
    return inner_.host_malloc(ptr, bytes);
  }
  Status do_host_free(void* ptr) override { return inner_.host_free(ptr); }
  Status do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    return inner_.copy_async(dst, src, bytes, stream);
  }
  Status do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) override {
    return inner_.fill_zero_async(dst, bytes, stream);
  }
  Status do_launch_host_function(Stream stream, HostFunction fn, void* user_data) override {
    return inner_.launch_host_function(stream, fn, user_data);
  }
  Status do_create_stream(Stream* stream) override { return inner_.create_stream(stream); }
  Status do_destroy_stream(Stream stream) override { return inner_.destroy_stream(stream); }
  Status do_synchronize_stream(Stream stream) override { return inner_.synchronize_stream(stream); }
  Status do_create_event(Event* event) override { return inner_.create_event(event); }
  Status do_destroy_event(Event event) override { return inner_.destroy_event(event); }
  Status do_record_event(Event event, Stream stream) override {
    return inner_.record_event(event, stream);
  }
  Status do_wait_event(Stream stream, Event event) override {
    return inner_.wait_event(stream, event);
  }
  Status do_query_event(Event event) override { return inner_.query_event(event); }
  Status do_synchronize_event(Event event) override { return inner_.synchronize_event(event); }
  Status do_synchronize() override { return inner_.synchronize(); }
  Status do_memory_info(MemoryInfo* info) override { return inner_.memory_info(info); }
  std::uint64_t do_now_ns() const override { return inner_.now_ns(); }
  std::string do_last_error() const override { return inner_.last_error(); }

  Device& inner_;
  mutable std::mutex mutex_;
  std::vector<std::pair<void*, std::size_t>> sizes_;
  Tally tally_;
  Status malloc_failure_ = Status::ok;
};

// Holds a stream busy: work queued on it after hold() waits until open().
// Declare it after the device: it opens and drains the stream on destruction.
class StreamGate {
 public:
  void hold(Device& device, Stream stream) {
    device_ = &device;
    stream_ = stream;
    ASSERT_EQ(device.launch_host_function(stream, &StreamGate::wait_for_open, this), Status::ok);
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  ~StreamGate() {  // never leave a stream worker blocked on a dead gate
    open();
    if (device_ != nullptr) device_->synchronize_stream(stream_);
  }

 private:
  static void wait_for_open(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock lock(gate->mutex_);
    gate->opened_.wait(lock, [gate] { return gate->open_; });
  }

  Device* device_ = nullptr;
  Stream stream_;
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// Allocates or fails the test with the allocator's message.
inline void* allocate_ok(CachingAllocator& allocator, std::size_t bytes, Stream stream = {}) {
  void* ptr = nullptr;
  const Status status = allocator.allocate(&ptr, bytes, stream);
  EXPECT_EQ(status, Status::ok) << CachingAllocator::last_error();
  EXPECT_NE(ptr, nullptr);
  return ptr;
}

inline std::uintptr_t address_of(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }

}  // namespace spillway::testing
