// Allocation replay on SimDevice; see allocation_replay.h.
#include "tools/replay/allocation_replay.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "allocator/caching/caching_allocator.h"
#include "allocator/device/sim_device.h"

namespace spillway {

double ReplayResult::fragmentation() const {
  if (peak_allocated_bytes() <= 0) return 0;
  return static_cast<double>(peak_reserved_bytes()) / static_cast<double>(peak_allocated_bytes());
}

bool replay_allocations(const AllocationTrace& trace, const ReplayOptions& options,
                        ReplayResult* result, std::string* error) {
  *result = ReplayResult{};
  // Unlimited: a device far larger than any trace; its memory is only
  // address space (no poisoning touches it).
  constexpr std::size_t kUnlimitedBytes = std::size_t{1} << 44;  // 16 TiB
  const std::size_t budget = options.budget_bytes == 0 ? kUnlimitedBytes : options.budget_bytes;
  SimDeviceOptions device_options;
  device_options.capacity_bytes = budget;
  device_options.poison_byte = -1;
  SimDevice device(device_options);

  CachingAllocatorOptions allocator_options;
  allocator_options.budget_bytes = budget;
  allocator_options.large_slab_bytes = options.chunk_size;
  allocator_options.expandable_segments = options.expandable_segments;

  struct Live {
    void* ptr;
    std::uint64_t size;
    std::uint64_t location;
  };
  std::unordered_map<std::uint64_t, Live> live;  // trace address -> replayed block
  std::unordered_set<std::uint64_t> failed;      // trace addresses whose alloc failed
  std::unordered_map<std::uint64_t, Stream> streams;
  // Each stream of the trace is a stream of the simulated device, which
  // runs a thread for it: a bound, so that a trace of thousands of stream
  // ids is an error rather than threads the system cannot start.
  constexpr std::size_t kMaxStreams = 256;
  {
    std::unordered_set<std::uint64_t> ids;
    for (const AllocationEvent& event : trace.events)
      if (event.stream != 0) ids.insert(event.stream);
    if (ids.size() > kMaxStreams) {
      *error = "the trace uses " + std::to_string(ids.size()) +
               " streams besides the default one; spillway-replay replays at most " +
               std::to_string(kMaxStreams) + " (a simulated stream each)";
      return false;
    }
  }
  std::uint64_t requested = 0;
  std::int64_t max_reserved = 0;
  bool ok = true;
  {
    CachingAllocator allocator(device, allocator_options);
    auto stream_for = [&](std::uint64_t id) -> Stream {
      if (id == 0) return Stream{};
      auto [it, inserted] = streams.try_emplace(id, Stream{});
      if (inserted && device.create_stream(&it->second) != Status::ok)
        throw std::runtime_error("the simulated device could not create a stream for stream " +
                                 std::to_string(id));
      return it->second;
    };
    for (const AllocationEvent& event : trace.events) {
      if (event.kind == AllocationEvent::Kind::release_cache) {
        ++result->cache_releases;
        allocator.empty_cache();
        continue;
      }
      if (event.kind == AllocationEvent::Kind::alloc) {
        if (const auto it = live.find(event.address); it != live.end()) {
          *error = trace.where(event) + ": alloc of address " + std::to_string(event.address) +
                   " which is still live (allocated at " +
                   trace.where({.location = it->second.location}) + ")";
          ok = false;
          break;
        }
        failed.erase(event.address);
        ++result->allocs;
        void* ptr = nullptr;
        if (allocator.allocate(&ptr, event.size, stream_for(event.stream)) != Status::ok) {
          ++result->failed_allocs;
          failed.insert(event.address);
          continue;
        }
        if (ptr == nullptr) {  // a zero-byte request: nothing to free later
          failed.insert(event.address);
          continue;
        }
        live.emplace(event.address, Live{ptr, event.size, event.location});
        if (const Stats now = allocator.stats(); now.reserved_bytes.current > max_reserved) {
          max_reserved = now.reserved_bytes.current;
          result->peak_reserved_location = event.location;
          result->peak_reserved_request_bytes = event.size;
          result->allocated_at_peak_reserved = now.allocated_bytes.current;
        }
        requested += event.size;
        result->peak_requested_bytes = std::max(result->peak_requested_bytes, requested);
      } else {
        ++result->frees;
        const auto it = live.find(event.address);
        if (it == live.end()) {
          if (failed.erase(event.address) == 0) ++result->unmatched_frees;
          continue;
        }
        allocator.deallocate(it->second.ptr);
        requested -= it->second.size;
        live.erase(it);
      }
    }
    result->stats = allocator.stats();
    for (const auto& [address, block] : live) allocator.deallocate(block.ptr);
  }
  for (const auto& [id, stream] : streams)
    if (stream != Stream{}) device.destroy_stream(stream);
  return ok;
}

}  // namespace spillway
