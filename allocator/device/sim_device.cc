// SimDevice: a GPU made of host memory and worker threads.
//
// Each stream is a StreamQueue: a FIFO of tasks run by one worker thread.
// Positions in a queue are counted: `submitted` tasks were queued, `completed`
// have finished. An event record is a (queue, ticket) pair where the ticket is
// the queue's submitted count at the time of the record; the event is complete
// once the queue's completed count reaches the ticket. Waiting on an event is a
// task on the waiting stream that blocks until that happens. This gives CUDA's
// event semantics exactly, with no extra task per record.
//
// Note [Reading before the event]
// A copy is a task, so it runs after copy_async returns. Its bytes land in
// slices, each at the moment the modelled transfer would have delivered it, and
// the last slice lands at the very end: a reader that does not wait for the
// copy's event sees old bytes in at least part of the destination. Tests rely on
// this (with set_copy_delay_ns it is the whole destination) to catch a missing
// wait.
//
// Note [Copy engines]
// With a modelled bandwidth, host-to-device and device-to-host copies each have
// one engine, as a GPU has one copy engine per direction: two concurrent copies
// in the same direction share it (the second starts when the first ends), and
// copies in opposite directions overlap. Device-to-device and host-to-host
// copies run at memcpy speed.
//
// Note [Stream lifetime]
// destroy_stream drains the queue and stops its worker, but keeps the queue
// object until the device is destroyed, so that an event recorded on it, or a
// wait task on another stream, can still read its final position. Nothing is
// ever destroyed on a worker thread, which could otherwise have to join itself.
#include "allocator/device/sim_device.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

namespace spillway {
namespace {

constexpr std::size_t kDeviceAlignment = 256;
constexpr std::size_t kCopySliceBytes = std::size_t{1} << 20;

thread_local std::string sim_last_error;

std::uint64_t steady_now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

void sleep_until_ns(std::uint64_t deadline_ns) {
  const std::uint64_t now = steady_now_ns();
  if (deadline_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(deadline_ns - now));
}

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string pointer_text(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

}  // namespace

class SimDevice::StreamQueue {
 public:
  StreamQueue() : worker_([this] { run(); }) {}
  ~StreamQueue() { stop(); }

  // Queues a task; returns the queue position just after it.
  std::uint64_t submit(std::function<void()> task) {
    std::uint64_t ticket;
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
      ticket = ++submitted_;
    }
    work_available_.notify_one();
    return ticket;
  }

  std::uint64_t submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }

  bool reached(std::uint64_t ticket) const {
    return completed_.load(std::memory_order_acquire) >= ticket;
  }

  void wait_until_reached(std::uint64_t ticket) {
    if (reached(ticket)) return;
    std::unique_lock lock(mutex_);
    progress_.wait(lock, [&] { return completed_.load(std::memory_order_relaxed) >= ticket; });
  }

  void drain() { wait_until_reached(submitted()); }

  // Runs what is queued, then ends the worker. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
    }
    work_available_.notify_one();
    worker_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_available_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything queued has run
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // destroy captures before the task counts as complete
      lock.lock();
      completed_.store(completed_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
      progress_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable work_available_;
  std::condition_variable progress_;
  std::deque<std::function<void()>> tasks_;
  std::uint64_t submitted_ = 0;
  std::atomic<std::uint64_t> completed_{0};
  bool stopping_ = false;
  std::thread worker_;  // last: starts once the members above exist
};

struct SimDevice::EventState {
  std::mutex mutex;
  StreamQueue* queue = nullptr;  // null: never recorded (complete)
  std::uint64_t ticket = 0;

  std::pair<StreamQueue*, std::uint64_t> snapshot() {
    std::lock_guard lock(mutex);
    return {queue, ticket};
  }
};

SimDevice::SimDevice(SimDeviceOptions options)
    : options_(options), default_stream_(std::make_unique<StreamQueue>()) {}

SimDevice::~SimDevice() {
  // Let queued work finish before the memory it may touch goes away.
  default_stream_->stop();
  for (auto& [handle, queue] : streams_) queue->stop();
  for (auto& [ptr, bytes] : device_allocations_) std::free(const_cast<void*>(ptr));
  for (auto& [ptr, bytes] : quarantine_) std::free(ptr);
  for (auto& [ptr, bytes] : host_allocations_) std::free(ptr);
  for (auto& [base, bytes] : address_ranges_) ::munmap(const_cast<void*>(base), bytes);
}

std::string SimDevice::do_name() const {
  char text[64];
  std::snprintf(text, sizeof text, "sim (%.2f GiB)",
                static_cast<double>(options_.capacity_bytes) / (1u << 30));
  return text;
}

Status SimDevice::fail(Status status, std::string detail) {
  sim_last_error = std::move(detail);
  return status;
}

bool SimDevice::consume_fault(std::atomic<std::uint64_t>& countdown) {
  std::uint64_t remaining = countdown.load();
  while (remaining != 0) {
    if (countdown.compare_exchange_weak(remaining, remaining - 1)) return remaining == 1;
  }
  return false;
}

Status SimDevice::do_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return fail(Status::invalid_argument, "malloc: null output pointer");
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;  // as cudaMalloc: no memory, a null pointer
  if (consume_fault(malloc_fault_countdown_)) {
    return fail(Status::injected_fault, "malloc: injected fault");
  }
  const std::size_t rounded = round_up(bytes, kDeviceAlignment);
  {
    std::lock_guard lock(memory_mutex_);
    if (rounded > options_.capacity_bytes - used_bytes_) {
      return fail(Status::out_of_memory, "malloc of " + std::to_string(bytes) + " bytes: " +
                                             std::to_string(options_.capacity_bytes - used_bytes_) +
                                             " bytes free on the simulated device");
    }
    used_bytes_ += rounded;
  }
  void* memory = std::aligned_alloc(kDeviceAlignment, rounded);
  std::lock_guard lock(memory_mutex_);
  if (memory == nullptr) {
    used_bytes_ -= rounded;
    return fail(Status::out_of_memory,
                "malloc: host memory backing the simulated device is exhausted");
  }
  device_allocations_.emplace(memory, rounded);
  *ptr = memory;
  return Status::ok;
}

Status SimDevice::do_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  // As cudaFree: work still queued may touch the memory, so wait for it.
  do_synchronize();
  std::size_t bytes;
  {
    std::lock_guard lock(memory_mutex_);
    auto found = device_allocations_.find(ptr);
    if (found == device_allocations_.end()) {
      return fail(Status::invalid_argument,
                  "free of " + pointer_text(ptr) + ", which is not a live device allocation");
    }
    bytes = found->second;
    device_allocations_.erase(found);
    used_bytes_ -= bytes;
  }
  if (options_.poison_byte < 0) {
    std::free(ptr);
    return Status::ok;
  }
  std::memset(ptr, options_.poison_byte, bytes);
  std::lock_guard lock(memory_mutex_);
  quarantine_.emplace_back(ptr, bytes);
  quarantine_bytes_ += bytes;
  while (quarantine_bytes_ > options_.quarantine_bytes) {
    auto [oldest, oldest_bytes] = quarantine_.front();
    quarantine_.pop_front();
    quarantine_bytes_ -= oldest_bytes;
    std::free(oldest);
  }
  return Status::ok;
}

std::string SimDevice::check_page_range(const char* call, const void* address,
                                        std::size_t bytes) const {
  const std::string what =
      std::string(call) + " of " + std::to_string(bytes) + " bytes at " + pointer_text(address);
  if (bytes == 0 || bytes % kPageBytes != 0 ||
      reinterpret_cast<std::uintptr_t>(address) % kPageBytes != 0) {
    return what + ": not whole pages of " + std::to_string(kPageBytes) + " bytes";
  }
  if (!range_in(address_ranges_, address, bytes)) {
    return what + ": not inside one reserved address range";
  }
  return {};
}

Status SimDevice::do_reserve_address_range(void** base, std::size_t bytes) {
  if (base == nullptr) return fail(Status::invalid_argument, "reserve_address_range: null output");
  *base = nullptr;
  if (bytes == 0 || bytes % kPageBytes != 0) {
    return fail(Status::invalid_argument,
                "reserve_address_range of " + std::to_string(bytes) + " bytes: not whole pages");
  }
  // Aligned to a page: reserve one page more and trim.
  void* raw = ::mmap(nullptr, bytes + kPageBytes, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) {
    return fail(Status::out_of_memory, "reserve_address_range of " + std::to_string(bytes) +
                                           " bytes: mmap: " + std::strerror(errno));
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = round_up(start, kPageBytes);
  if (aligned > start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = start + bytes + kPageBytes;
  if (end > aligned + bytes)
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  std::lock_guard lock(memory_mutex_);
  address_ranges_.emplace(reinterpret_cast<void*>(aligned), bytes);
  *base = reinterpret_cast<void*>(aligned);
  return Status::ok;
}

Status SimDevice::do_release_address_range(void* base, std::size_t bytes) {
  std::lock_guard lock(memory_mutex_);
  const auto found = address_ranges_.find(base);
  if (found == address_ranges_.end() || found->second != bytes) {
    return fail(Status::invalid_argument, "release_address_range of " + pointer_text(base) +
                                              ": not a reserved range of " + std::to_string(bytes) +
                                              " bytes");
  }
  const auto inside = mapped_ranges_.lower_bound(base);
  if (inside != mapped_ranges_.end() &&
      static_cast<const char*>(inside->first) < static_cast<const char*>(base) + bytes) {
    return fail(Status::invalid_argument, "release_address_range of " + pointer_text(base) +
                                              ": pages are still mapped in it");
  }
  ::munmap(base, bytes);
  address_ranges_.erase(found);
  return Status::ok;
}

Status SimDevice::do_map_pages(void* address, std::size_t bytes) {
  if (consume_fault(malloc_fault_countdown_)) {
    return fail(Status::injected_fault, "map_pages: injected fault");
  }
  // As cudaMalloc: map/unmap do not wait for streams, the caller orders them.
  std::lock_guard lock(memory_mutex_);
  if (std::string problem = check_page_range("map_pages", address, bytes); !problem.empty()) {
    return fail(Status::invalid_argument, std::move(problem));
  }
  const auto begin = static_cast<const char*>(address);
  auto after = mapped_ranges_.lower_bound(address);
  const bool overlaps_next =
      after != mapped_ranges_.end() && static_cast<const char*>(after->first) < begin + bytes;
  const bool overlaps_prev =
      after != mapped_ranges_.begin() &&
      static_cast<const char*>(std::prev(after)->first) + std::prev(after)->second > begin;
  if (overlaps_next || overlaps_prev) {
    return fail(Status::invalid_argument, "map_pages of " + std::to_string(bytes) + " bytes at " +
                                              pointer_text(address) + ": already mapped");
  }
  if (bytes > options_.capacity_bytes - used_bytes_) {
    return fail(Status::out_of_memory, "map_pages of " + std::to_string(bytes) + " bytes: " +
                                           std::to_string(options_.capacity_bytes - used_bytes_) +
                                           " bytes free on the simulated device");
  }
  if (::mprotect(address, bytes, PROT_READ | PROT_WRITE) != 0) {
    return fail(Status::out_of_memory, std::string("map_pages: mprotect: ") + std::strerror(errno));
  }
  used_bytes_ += bytes;
  mapped_bytes_ += bytes;
  // Join with the runs either side, so a copy may span pages mapped apart.
  const void* run_begin = address;
  std::size_t run_bytes = bytes;
  if (after != mapped_ranges_.end() && after->first == begin + bytes) {
    run_bytes += after->second;
    after = mapped_ranges_.erase(after);
  }
  if (after != mapped_ranges_.begin()) {
    auto before = std::prev(after);
    if (static_cast<const char*>(before->first) + before->second == begin) {
      before->second += run_bytes;
      return Status::ok;
    }
  }
  mapped_ranges_.emplace(run_begin, run_bytes);
  return Status::ok;
}

Status SimDevice::do_unmap_pages(void* address, std::size_t bytes) {
  std::lock_guard lock(memory_mutex_);
  if (std::string problem = check_page_range("unmap_pages", address, bytes); !problem.empty()) {
    return fail(Status::invalid_argument, std::move(problem));
  }
  auto run = mapped_ranges_.upper_bound(address);
  if (run == mapped_ranges_.begin() || !range_in(mapped_ranges_, address, bytes)) {
    return fail(Status::invalid_argument, "unmap_pages of " + std::to_string(bytes) + " bytes at " +
                                              pointer_text(address) + ": not all mapped");
  }
  --run;
  const auto begin = static_cast<const char*>(address);
  const auto run_begin = static_cast<const char*>(run->first);
  const auto run_end = run_begin + run->second;
  // The memory goes back to the host, and a later use faults.
  ::madvise(address, bytes, MADV_DONTNEED);
  ::mprotect(address, bytes, PROT_NONE);
  used_bytes_ -= bytes;
  mapped_bytes_ -= bytes;
  mapped_ranges_.erase(run);
  if (run_begin < begin)
    mapped_ranges_.emplace(run_begin, static_cast<std::size_t>(begin - run_begin));
  if (begin + bytes < run_end) {
    mapped_ranges_.emplace(begin + bytes, static_cast<std::size_t>(run_end - begin - bytes));
  }
  return Status::ok;
}

std::size_t SimDevice::mapped_bytes() const {
  std::lock_guard lock(memory_mutex_);
  return mapped_bytes_;
}

bool SimDevice::is_mapped(const void* ptr, std::size_t bytes) const {
  std::lock_guard lock(memory_mutex_);
  return range_in(mapped_ranges_, ptr, bytes);
}

Status SimDevice::do_host_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return fail(Status::invalid_argument, "host_malloc: null output pointer");
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;
  if (consume_fault(host_malloc_fault_countdown_)) {
    return fail(Status::injected_fault, "host_malloc: injected fault (pinning refused)");
  }
  void* memory = std::aligned_alloc(kDeviceAlignment, round_up(bytes, kDeviceAlignment));
  if (memory == nullptr) return fail(Status::out_of_memory, "host_malloc: out of host memory");
  std::lock_guard lock(memory_mutex_);
  host_allocations_.emplace(memory, bytes);
  *ptr = memory;
  return Status::ok;
}

Status SimDevice::do_host_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  do_synchronize();  // as cudaFreeHost
  {
    std::lock_guard lock(memory_mutex_);
    if (host_allocations_.erase(ptr) == 0) {
      return fail(Status::invalid_argument,
                  "host_free of " + pointer_text(ptr) + ", which is not a live pinned allocation");
    }
  }
  std::free(ptr);
  return Status::ok;
}

bool SimDevice::range_in_device_allocation(const void* ptr, std::size_t bytes) const {
  return range_in(device_allocations_, ptr, bytes) || range_in(mapped_ranges_, ptr, bytes);
}

bool SimDevice::range_in(const std::map<const void*, std::size_t>& ranges, const void* ptr,
                         std::size_t bytes) {
  auto after = ranges.upper_bound(ptr);
  if (after == ranges.begin()) return false;
  const auto& [base, size] = *std::prev(after);
  const auto offset =
      static_cast<std::size_t>(static_cast<const char*>(ptr) - static_cast<const char*>(base));
  return offset < size && bytes <= size - offset;
}

std::size_t SimDevice::allocation_size(const void* ptr) const {
  std::lock_guard lock(memory_mutex_);
  auto found = device_allocations_.find(ptr);
  return found == device_allocations_.end() ? 0 : found->second;
}

bool SimDevice::is_device_pointer(const void* ptr) const {
  std::lock_guard lock(memory_mutex_);
  return range_in_device_allocation(ptr, 1);
}

std::size_t SimDevice::used_bytes() const {
  std::lock_guard lock(memory_mutex_);
  return used_bytes_;
}

// A pointer that lies in no device allocation is host memory (pinned or not:
// cudaMemcpyAsync accepts both). A range that starts in a device allocation
// must end in it too.
SimDevice::CopyDirection SimDevice::classify_copy(void* dst, const void* src, std::size_t bytes,
                                                  bool* in_bounds) const {
  std::lock_guard lock(memory_mutex_);
  const bool dst_on_device = range_in_device_allocation(dst, 1);
  const bool src_on_device = range_in_device_allocation(src, 1);
  *in_bounds = (!dst_on_device || range_in_device_allocation(dst, bytes)) &&
               (!src_on_device || range_in_device_allocation(src, bytes));
  if (dst_on_device && !src_on_device) return CopyDirection::host_to_device;
  if (src_on_device && !dst_on_device) return CopyDirection::device_to_host;
  return CopyDirection::other;
}

void SimDevice::run_copy(void* dst, const void* src, std::size_t bytes, CopyDirection direction,
                         std::uint64_t delay_ns) {
  if (delay_ns != 0) sleep_until_ns(steady_now_ns() + delay_ns);
  const double bandwidth = options_.bandwidth_bytes_per_s;
  if (bandwidth <= 0 || direction == CopyDirection::other) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Reserve this direction's engine (Note [Copy engines]).
  const auto transfer_ns = static_cast<std::uint64_t>(static_cast<double>(bytes) * 1e9 / bandwidth);
  std::uint64_t start_ns;
  {
    std::lock_guard lock(engines_mutex_);
    std::uint64_t& engine_free_at = direction == CopyDirection::host_to_device
                                        ? h2d_engine_free_at_ns_
                                        : d2h_engine_free_at_ns_;
    start_ns = std::max(steady_now_ns(), engine_free_at) + options_.copy_latency_ns;
    engine_free_at = start_ns + transfer_ns;
  }
  sleep_until_ns(start_ns);
  // Deliver slice by slice at the modelled rate (Note [Reading before the event]).
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t slice = std::min(kCopySliceBytes, bytes - done);
    const auto slice_end_ns =
        start_ns + static_cast<std::uint64_t>(static_cast<double>(done + slice) * 1e9 / bandwidth);
    sleep_until_ns(slice_end_ns);
    std::memcpy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done, slice);
    done += slice;
  }
}

Status SimDevice::do_copy_async(void* dst, const void* src, std::size_t bytes, Stream stream) {
  StreamQueue* queue = find_stream(stream);
  if (queue == nullptr) return fail(Status::invalid_argument, "copy_async: unknown stream");
  if (bytes == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) {
    return fail(Status::invalid_argument, "copy_async: null source or destination");
  }
  bool in_bounds = false;
  const CopyDirection direction = classify_copy(dst, src, bytes, &in_bounds);
  if (!in_bounds) {
    return fail(Status::invalid_argument,
                "copy_async of " + std::to_string(bytes) + " bytes from " + pointer_text(src) +
                    " to " + pointer_text(dst) + " runs past the end of a device allocation");
  }
  const std::uint64_t delay_ns = copy_delay_ns_.load();
  queue->submit([=, this] { run_copy(dst, src, bytes, direction, delay_ns); });
  return Status::ok;
}

// A fill runs on the device's own memory, so the modelled link does not slow
// it (a memset at the host's speed stands in for a device kernel).
Status SimDevice::do_fill_zero_async(void* dst, std::size_t bytes, Stream stream) {
  StreamQueue* queue = find_stream(stream);
  if (queue == nullptr) return fail(Status::invalid_argument, "fill_zero_async: unknown stream");
  if (bytes == 0) return Status::ok;
  bool in_bounds = false;
  {
    std::lock_guard lock(memory_mutex_);
    in_bounds = dst != nullptr && range_in_device_allocation(dst, bytes);
  }
  if (!in_bounds) {
    return fail(Status::invalid_argument, "fill_zero_async of " + std::to_string(bytes) +
                                              " bytes at " + pointer_text(dst) +
                                              " is not within one device allocation");
  }
  queue->submit([dst, bytes] { std::memset(dst, 0, bytes); });
  return Status::ok;
}

Status SimDevice::do_launch_host_function(Stream stream, HostFunction fn, void* user_data) {
  StreamQueue* queue = find_stream(stream);
  if (queue == nullptr)
    return fail(Status::invalid_argument, "launch_host_function: unknown stream");
  if (fn == nullptr) return fail(Status::invalid_argument, "launch_host_function: null function");
  queue->submit([fn, user_data] { fn(user_data); });
  return Status::ok;
}

SimDevice::StreamQueue* SimDevice::find_stream(Stream stream) {
  if (stream.handle == nullptr) return default_stream_.get();
  std::lock_guard lock(handles_mutex_);
  auto found = streams_.find(stream.handle);
  return found == streams_.end() ? nullptr : found->second.get();
}

SimDevice::EventState* SimDevice::find_event(Event event) {
  std::lock_guard lock(handles_mutex_);
  auto found = events_.find(event.handle);
  return found == events_.end() ? nullptr : found->second.get();
}

Status SimDevice::do_create_stream(Stream* stream) {
  if (stream == nullptr) return fail(Status::invalid_argument, "create_stream: null output");
  auto queue = std::make_unique<StreamQueue>();
  stream->handle = queue.get();
  std::lock_guard lock(handles_mutex_);
  streams_.emplace(stream->handle, std::move(queue));
  return Status::ok;
}

Status SimDevice::do_destroy_stream(Stream stream) {
  if (stream.handle == nullptr) {
    return fail(Status::invalid_argument, "destroy_stream: the default stream cannot be destroyed");
  }
  std::unique_ptr<StreamQueue> queue;
  {
    std::lock_guard lock(handles_mutex_);
    auto found = streams_.find(stream.handle);
    if (found == streams_.end())
      return fail(Status::invalid_argument, "destroy_stream: unknown stream");
    queue = std::move(found->second);
    streams_.erase(found);
  }
  queue->stop();  // runs what is queued first (Note [Stream lifetime])
  std::lock_guard lock(handles_mutex_);
  retired_streams_.push_back(std::move(queue));
  return Status::ok;
}

Status SimDevice::do_synchronize_stream(Stream stream) {
  StreamQueue* queue = find_stream(stream);
  if (queue == nullptr) return fail(Status::invalid_argument, "synchronize_stream: unknown stream");
  queue->drain();
  return Status::ok;
}

Status SimDevice::do_create_event(Event* event) {
  if (event == nullptr) return fail(Status::invalid_argument, "create_event: null output");
  auto state = std::make_unique<EventState>();
  event->handle = state.get();
  std::lock_guard lock(handles_mutex_);
  events_.emplace(event->handle, std::move(state));
  return Status::ok;
}

Status SimDevice::do_destroy_event(Event event) {
  std::lock_guard lock(handles_mutex_);
  if (events_.erase(event.handle) == 0)
    return fail(Status::invalid_argument, "destroy_event: unknown event");
  return Status::ok;
}

Status SimDevice::do_record_event(Event event, Stream stream) {
  EventState* state = find_event(event);
  StreamQueue* queue = find_stream(stream);
  if (state == nullptr || queue == nullptr) {
    return fail(Status::invalid_argument, "record_event: unknown event or stream");
  }
  std::lock_guard lock(state->mutex);
  state->queue = queue;
  state->ticket = queue->submitted();
  return Status::ok;
}

Status SimDevice::do_wait_event(Stream stream, Event event) {
  EventState* state = find_event(event);
  StreamQueue* waiter = find_stream(stream);
  if (state == nullptr || waiter == nullptr) {
    return fail(Status::invalid_argument, "wait_event: unknown event or stream");
  }
  auto [queue, ticket] = state->snapshot();
  // Never recorded, already complete, or recorded on the waiting stream itself
  // (FIFO order already guarantees it): nothing to wait for.
  if (queue == nullptr || queue == waiter || queue->reached(ticket)) return Status::ok;
  waiter->submit([queue, ticket] { queue->wait_until_reached(ticket); });
  return Status::ok;
}

Status SimDevice::do_query_event(Event event) {
  EventState* state = find_event(event);
  if (state == nullptr) return fail(Status::invalid_argument, "query_event: unknown event");
  auto [queue, ticket] = state->snapshot();
  return queue == nullptr || queue->reached(ticket) ? Status::ok : Status::not_ready;
}

Status SimDevice::do_synchronize_event(Event event) {
  EventState* state = find_event(event);
  if (state == nullptr) return fail(Status::invalid_argument, "synchronize_event: unknown event");
  auto [queue, ticket] = state->snapshot();
  if (queue != nullptr) queue->wait_until_reached(ticket);
  return Status::ok;
}

Status SimDevice::do_synchronize() {
  std::vector<std::pair<StreamQueue*, std::uint64_t>> positions;
  {
    std::lock_guard lock(handles_mutex_);
    positions.emplace_back(default_stream_.get(), default_stream_->submitted());
    for (auto& [handle, queue] : streams_) positions.emplace_back(queue.get(), queue->submitted());
  }
  for (auto& [queue, ticket] : positions) queue->wait_until_reached(ticket);
  return Status::ok;
}

Status SimDevice::do_memory_info(MemoryInfo* info) {
  if (info == nullptr) return fail(Status::invalid_argument, "memory_info: null output");
  std::lock_guard lock(memory_mutex_);
  info->total_bytes = options_.capacity_bytes;
  info->free_bytes = options_.capacity_bytes - used_bytes_;
  return Status::ok;
}

std::uint64_t SimDevice::do_now_ns() const { return steady_now_ns(); }

std::string SimDevice::do_last_error() const { return sim_last_error; }

}  // namespace spillway
