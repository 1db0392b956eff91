// The device seam: everything spillway asks of a GPU, and nothing more.
//
// A Device hands out device memory and pinned host memory, copies bytes
// asynchronously on streams, and orders streams with events. Two backends
// implement it: CudaDevice (the CUDA runtime) and SimDevice (a simulated GPU
// backed by host memory, with real asynchronous streams). Every layer above
// takes a Device& so its policies can be tested on SimDevice without globals.
//
// Errors come back as a Status, never as an exception: callers decide what an
// error means (the allocator, for instance, turns out_of_memory into a spill).
//
// Semantics follow CUDA's, so code that is correct on SimDevice is correct on
// a GPU:
//  - work on one stream runs in submission order (FIFO);
//  - record_event(e, s) marks the point in s's queue reached so far; e is
//    complete once everything submitted to s before the record has run;
//  - wait_event(s, e) makes work submitted to s afterwards wait for the
//    most recent record of e at the time of the call; an event never recorded
//    counts as complete;
//  - copy_async returns before the copy runs: its destination must not be read
//    until an event recorded after it has completed. See Note [Reading before
//    the event] in sim_device.cc.
//
// The public methods are non-virtual wrappers over private virtuals (the
// RMM/NVI shape), so cross-cutting checks can be added in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spillway {

enum class Status : int {
  ok = 0,
  not_ready,         // event_query: the event's work has not finished yet
  out_of_memory,     // the device (or host pinning) has no room for the request
  invalid_argument,  // unknown pointer, handle or size
  unavailable,       // the backend cannot run here (no driver, no device)
  injected_fault,    // a failure injected by a test (SimDevice only)
  error,             // anything else the backend reported; see Device::last_error()
};

std::string_view to_string(Status status);

enum class DeviceKind { cuda, sim };

std::string_view to_string(DeviceKind kind);

// Opaque handles. A default-constructed Stream is the device's default stream.
struct Stream {
  void* handle = nullptr;
  friend bool operator==(Stream, Stream) = default;
};

struct Event {
  void* handle = nullptr;
  friend bool operator==(Event, Event) = default;
};

struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// A function run on a stream, in order with its other work (cudaLaunchHostFunc).
using HostFunction = void (*)(void* user_data);

class Device {
 public:
  virtual ~Device() = default;

  DeviceKind kind() const { return do_kind(); }
  // Human-readable name, e.g. "sim (4.00 GiB)" or "cuda:0 NVIDIA H200".
  std::string name() const { return do_name(); }

  // Device memory, aligned to at least 256 bytes.
  Status malloc(void** ptr, std::size_t bytes) { return do_malloc(ptr, bytes); }
  Status free(void* ptr) { return do_free(ptr); }

  // Virtual memory: address space reserved without memory behind it, then
  // backed page by page, so a segment can grow and shrink in place (Note
  // [Virtual memory pages] in device.cc). page_bytes() is the page size, 0
  // when the backend has none; then the other four return unavailable.
  // Mapped pages count against the device's memory exactly like malloc.
  std::size_t page_bytes() const { return do_page_bytes(); }
  // `bytes` a multiple of page_bytes(). The range must be unmapped before
  // it is released.
  Status reserve_address_range(void** base, std::size_t bytes) {
    return do_reserve_address_range(base, bytes);
  }
  Status release_address_range(void* base, std::size_t bytes) {
    return do_release_address_range(base, bytes);
  }
  // Page-aligned ranges inside a reserved range; map_pages wants them
  // unmapped, unmap_pages wants them mapped (by any earlier map_pages).
  // Neither waits for queued work: no work may touch pages being unmapped.
  Status map_pages(void* address, std::size_t bytes) { return do_map_pages(address, bytes); }
  Status unmap_pages(void* address, std::size_t bytes) { return do_unmap_pages(address, bytes); }

  // Page-locked host memory, the source and target of asynchronous copies.
  Status host_malloc(void** ptr, std::size_t bytes) { return do_host_malloc(ptr, bytes); }
  Status host_free(void* ptr) { return do_host_free(ptr); }

  // Copies `bytes` from src to dst in stream order; either side may be device
  // or host memory. Returns once the copy is queued.
  Status copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
    return do_copy_async(dst, src, bytes, stream);
  }
  // Sets `bytes` of device memory at dst to zero in stream order, on the
  // device: nothing crosses the host link. Returns once it is queued.
  Status fill_zero_async(void* dst, std::size_t bytes, Stream stream) {
    return do_fill_zero_async(dst, bytes, stream);
  }
  // Runs fn(user_data) in stream order, on a thread of the backend's choosing.
  // fn must not call the Device (CUDA forbids it), and host functions on
  // different streams may run one at a time (CUDA may serialise them).
  Status launch_host_function(Stream stream, HostFunction fn, void* user_data) {
    return do_launch_host_function(stream, fn, user_data);
  }

  Status create_stream(Stream* stream) { return do_create_stream(stream); }
  Status destroy_stream(Stream stream) { return do_destroy_stream(stream); }
  Status synchronize_stream(Stream stream) { return do_synchronize_stream(stream); }

  Status create_event(Event* event) { return do_create_event(event); }
  Status destroy_event(Event event) { return do_destroy_event(event); }
  Status record_event(Event event, Stream stream) { return do_record_event(event, stream); }
  Status wait_event(Stream stream, Event event) { return do_wait_event(stream, event); }
  // ok when complete, not_ready when not yet.
  Status query_event(Event event) { return do_query_event(event); }
  Status synchronize_event(Event event) { return do_synchronize_event(event); }

  // Waits for all work on all streams.
  Status synchronize() { return do_synchronize(); }

  Status memory_info(MemoryInfo* info) { return do_memory_info(info); }

  // Monotonic clock in nanoseconds, shared by everything that timestamps events.
  std::uint64_t now_ns() const { return do_now_ns(); }

  // Detail of the last error this thread saw from this backend (e.g. the
  // CUDA error string); empty when there is none.
  std::string last_error() const { return do_last_error(); }

 private:
  virtual DeviceKind do_kind() const = 0;
  virtual std::string do_name() const = 0;
  virtual Status do_malloc(void** ptr, std::size_t bytes) = 0;
  virtual Status do_free(void* ptr) = 0;
  // Backends without virtual memory keep these defaults (device.cc).
  virtual std::size_t do_page_bytes() const { return 0; }
  virtual Status do_reserve_address_range(void** base, std::size_t bytes);
  virtual Status do_release_address_range(void* base, std::size_t bytes);
  virtual Status do_map_pages(void* address, std::size_t bytes);
  virtual Status do_unmap_pages(void* address, std::size_t bytes);
  virtual Status do_host_malloc(void** ptr, std::size_t bytes) = 0;
  virtual Status do_host_free(void* ptr) = 0;
  virtual Status do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  virtual Status do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) = 0;
  virtual Status do_launch_host_function(Stream stream, HostFunction fn, void* user_data) = 0;
  virtual Status do_create_stream(Stream* stream) = 0;
  virtual Status do_destroy_stream(Stream stream) = 0;
  virtual Status do_synchronize_stream(Stream stream) = 0;
  virtual Status do_create_event(Event* event) = 0;
  virtual Status do_destroy_event(Event event) = 0;
  virtual Status do_record_event(Event event, Stream stream) = 0;
  virtual Status do_wait_event(Stream stream, Event event) = 0;
  virtual Status do_query_event(Event event) = 0;
  virtual Status do_synchronize_event(Event event) = 0;
  virtual Status do_synchronize() = 0;
  virtual Status do_memory_info(MemoryInfo* info) = 0;
  virtual std::uint64_t do_now_ns() const = 0;
  virtual std::string do_last_error() const = 0;
};

}  // namespace spillway
