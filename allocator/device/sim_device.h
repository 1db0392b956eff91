// SimDevice: a simulated GPU for CI, tests, benchmarks and planning.
//
// Device memory is real host memory, so tensors can live in it; capacity is
// fixed. Each stream is a real asynchronous FIFO queue run by its own worker
// thread, so a missing event wait is a real race that tests can observe.
// Copies can be given a modelled bandwidth and latency; faults can be
// injected (fail the Nth device malloc or host malloc, delay every copy); freed
// device memory is poisoned so stale reads show.
//
// Virtual memory (Note [Virtual memory pages] in device.cc) is host address
// space reserved PROT_NONE and made readable and writable page by page; a
// mapped page counts against the capacity exactly like malloc, and an
// unmapped one is handed back to the host (MADV_DONTNEED) and faults on use,
// as on a GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "allocator/device/device.h"

namespace spillway {

struct SimDeviceOptions {
  std::size_t capacity_bytes = std::size_t{4} << 30;
  // Modelled copy speed in bytes per second; 0 copies at memcpy speed.
  double bandwidth_bytes_per_s = 0;
  // Modelled fixed cost of each copy, added to its transfer time.
  std::uint64_t copy_latency_ns = 0;
  // Byte written over device memory when it is freed; -1 disables poisoning.
  // Freed blocks stay mapped (poisoned) until quarantine_bytes more are freed.
  int poison_byte = 0xDB;
  std::size_t quarantine_bytes = std::size_t{64} << 20;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceOptions options = {});
  ~SimDevice() override;

  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  const SimDeviceOptions& options() const { return options_; }

  // Fault injection. The Nth call from now (1 = the next one) fails with
  // Status::injected_fault; 0 disarms.
  void fail_nth_malloc(std::uint64_t n) { malloc_fault_countdown_.store(n); }
  void fail_nth_host_malloc(std::uint64_t n) { host_malloc_fault_countdown_.store(n); }
  // Every copy queued from now on starts this much later than it would.
  void set_copy_delay_ns(std::uint64_t ns) { copy_delay_ns_.store(ns); }

  // Size of a live device allocation starting at ptr, 0 if none.
  std::size_t allocation_size(const void* ptr) const;
  // True when ptr lies inside a live device allocation (for checks in tests).
  bool is_device_pointer(const void* ptr) const;
  std::size_t used_bytes() const;  // malloc'd and mapped

  static constexpr std::size_t kPageBytes = std::size_t{2} << 20;
  // Bytes of pages mapped now, in all reserved ranges.
  std::size_t mapped_bytes() const;
  // True when every page of [ptr, ptr + bytes) is mapped.
  bool is_mapped(const void* ptr, std::size_t bytes) const;

 private:
  class StreamQueue;
  struct EventState;

  DeviceKind do_kind() const override { return DeviceKind::sim; }
  std::string do_name() const override;
  Status do_malloc(void** ptr, std::size_t bytes) override;
  Status do_free(void* ptr) override;
  std::size_t do_page_bytes() const override { return kPageBytes; }
  Status do_reserve_address_range(void** base, std::size_t bytes) override;
  Status do_release_address_range(void* base, std::size_t bytes) override;
  Status do_map_pages(void* address, std::size_t bytes) override;
  Status do_unmap_pages(void* address, std::size_t bytes) override;
  Status do_host_malloc(void** ptr, std::size_t bytes) override;
  Status do_host_free(void* ptr) override;
  Status do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  Status do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) override;
  Status do_launch_host_function(Stream stream, HostFunction fn, void* user_data) override;
  Status do_create_stream(Stream* stream) override;
  Status do_destroy_stream(Stream stream) override;
  Status do_synchronize_stream(Stream stream) override;
  Status do_create_event(Event* event) override;
  Status do_destroy_event(Event event) override;
  Status do_record_event(Event event, Stream stream) override;
  Status do_wait_event(Stream stream, Event event) override;
  Status do_query_event(Event event) override;
  Status do_synchronize_event(Event event) override;
  Status do_synchronize() override;
  Status do_memory_info(MemoryInfo* info) override;
  std::uint64_t do_now_ns() const override;
  std::string do_last_error() const override;

  enum class CopyDirection { host_to_device, device_to_host, other };

  StreamQueue* find_stream(Stream stream);
  EventState* find_event(Event event);
  CopyDirection classify_copy(void* dst, const void* src, std::size_t bytes, bool* in_bounds) const;
  bool range_in_device_allocation(const void* ptr, std::size_t bytes) const;
  static bool range_in(const std::map<const void*, std::size_t>& ranges, const void* ptr,
                       std::size_t bytes);
  // Problem with a map/unmap of [address, address + bytes), or empty.
  std::string check_page_range(const char* call, const void* address, std::size_t bytes) const;
  void run_copy(void* dst, const void* src, std::size_t bytes, CopyDirection direction,
                std::uint64_t delay_ns);
  static bool consume_fault(std::atomic<std::uint64_t>& countdown);
  static Status fail(Status status, std::string detail);

  const SimDeviceOptions options_;
  std::atomic<std::uint64_t> malloc_fault_countdown_{0};
  std::atomic<std::uint64_t> host_malloc_fault_countdown_{0};
  std::atomic<std::uint64_t> copy_delay_ns_{0};

  mutable std::mutex memory_mutex_;
  std::map<const void*, std::size_t> device_allocations_;  // ordered: range lookups
  std::unordered_map<void*, std::size_t> host_allocations_;
  std::size_t used_bytes_ = 0;
  std::map<const void*, std::size_t> address_ranges_;  // reserved: base -> bytes
  std::map<const void*, std::size_t> mapped_ranges_;   // mapped runs, adjacent ones joined
  std::size_t mapped_bytes_ = 0;
  // Freed, poisoned device blocks not yet returned to the host heap, so a
  // stale read sees the poison rather than undefined behaviour.
  std::deque<std::pair<void*, std::size_t>> quarantine_;
  std::size_t quarantine_bytes_ = 0;

  // One modelled copy engine per direction: the time each is busy until.
  std::mutex engines_mutex_;
  std::uint64_t h2d_engine_free_at_ns_ = 0;
  std::uint64_t d2h_engine_free_at_ns_ = 0;

  mutable std::mutex handles_mutex_;
  std::unique_ptr<StreamQueue> default_stream_;
  std::unordered_map<void*, std::unique_ptr<StreamQueue>> streams_;
  // Destroyed streams, drained and stopped, kept so that events and waits
  // that still name them read their final position (Note [Stream lifetime]).
  std::vector<std::unique_ptr<StreamQueue>> retired_streams_;
  std::unordered_map<void*, std::unique_ptr<EventState>> events_;
};

}  // namespace spillway
