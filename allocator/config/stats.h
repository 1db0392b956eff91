// Stats: every figure spillway reports, declared once.
//
// Key names (a contract, design section 3) follow PyTorch's
// torch.cuda.memory_stats() so users and tools can map them one to one:
// "allocated_bytes.all.current" etc., plus spillway's own keys for model data.
// To add a figure, add one line to an X-macro below; the JSON writer and the
// flat key list follow.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace spillway {

// PyTorch's Stat: a gauge with its peak and the running totals both ways.
struct StatArray {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed

  void increase(std::int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
  friend bool operator==(const StatArray&, const StatArray&) = default;
};

// X(member, "json key prefix"): written as "<prefix>.all.current|peak|allocated|freed".
#define SPILLWAY_STAT_ARRAYS(X)         \
  X(allocated_bytes, "allocated_bytes") \
  X(reserved_bytes, "reserved_bytes")   \
  X(active_bytes, "active_bytes")       \
  X(allocation, "allocation")           \
  X(segment, "segment")

// X(member, "json key prefix"): a part of an array above, written as
// "<prefix>.current|peak|allocated|freed": allocated bytes split by owner
// (CachingAllocator's AllocationOwner), model chunks and everything else.
#define SPILLWAY_STAT_PARTS(X)                      \
  X(allocated_bytes_model, "allocated_bytes.model") \
  X(allocated_bytes_non_model, "allocated_bytes.non_model")

// X(member, "json key"): plain counters and gauges. chunk_bytes.capacity is
// the capacity of every managed chunk (all clients, wherever its bytes are),
// chunk_bytes.tensors the bytes of their tensors; their ratio is
// chunk_fill_ratio.
#define SPILLWAY_STAT_SCALARS(X)                            \
  X(num_alloc_retries, "num_alloc_retries")                 \
  X(num_ooms, "num_ooms")                                   \
  X(num_spills_for_allocation, "num_spills_for_allocation") \
  X(num_budget_overruns, "num_budget_overruns")             \
  X(min_budget_bytes, "min_budget_bytes")                   \
  X(num_device_alloc, "num_device_alloc")                   \
  X(num_device_free, "num_device_free")                     \
  X(chunk_bytes_device, "chunk_bytes.device")               \
  X(chunk_bytes_host, "chunk_bytes.host")                   \
  X(chunk_bytes_capacity, "chunk_bytes.capacity")           \
  X(chunk_bytes_tensors, "chunk_bytes.tensors")             \
  X(bytes_moved_h2d, "bytes_moved.h2d")                     \
  X(bytes_moved_d2h, "bytes_moved.d2h")                     \
  X(evictions, "evictions")                                 \
  X(prefetches, "prefetches")                               \
  X(stall_ns, "stall_ns")                                   \
  X(stall_ns_expected, "stall_ns.expected")                 \
  X(stall_ns_actual, "stall_ns.actual")                     \
  X(stall_last_expected, "stall_ns.expected.last_step")     \
  X(stall_last_actual, "stall_ns.actual.last_step")

// Tensor bytes over chunk bytes; 0 when there are no chunks.
inline double chunk_fill_ratio(std::int64_t tensor_bytes, std::int64_t capacity_bytes) {
  return capacity_bytes <= 0
             ? 0.0
             : static_cast<double>(tensor_bytes) / static_cast<double>(capacity_bytes);
}

struct Stats {
#define SPILLWAY_DECLARE_ARRAY(member, key) StatArray member;
#define SPILLWAY_DECLARE_SCALAR(member, key) std::int64_t member = 0;
  SPILLWAY_STAT_ARRAYS(SPILLWAY_DECLARE_ARRAY)
  SPILLWAY_STAT_PARTS(SPILLWAY_DECLARE_ARRAY)
  SPILLWAY_STAT_SCALARS(SPILLWAY_DECLARE_SCALAR)
#undef SPILLWAY_DECLARE_ARRAY
#undef SPILLWAY_DECLARE_SCALAR

  void reset_peaks();

  // chunk_bytes.tensors over chunk_bytes.capacity: how much of the chunks'
  // memory holds tensors. 0 while there are no chunks.
  double chunk_fill_ratio() const;

  // Every integer figure as (key, value), in declaration order.
  std::vector<std::pair<std::string, std::int64_t>> flatten() const;
  // One flat JSON object of flatten()'s pairs, then "chunk_fill_ratio" (a
  // number between 0 and 1).
  std::string to_json() const;

  friend bool operator==(const Stats&, const Stats&) = default;
};

}  // namespace spillway
