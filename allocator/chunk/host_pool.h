// HostPool: host memory for the host copies of chunks.
//
// Copies between the device and pinned (page-locked) host memory run
// asynchronously at full bandwidth, so host copies are pinned while the
// pinned bytes stay within `pinned_budget_bytes` (the host_budget option).
// Pinning is costly (it maps and locks pages), so blocks are allocated on
// first need and cached when given back, for the next chunk of the same size.
//
// Note [Pageable fallback]
// Pinning can fail (RLIMIT_MEMLOCK in containers, an exhausted driver pool).
// Then the pool warns once and serves pageable memory from then on: copies
// from it are slower and less asynchronous, but correct. Past the pinned
// budget it also serves pageable memory (one warning of its own): a host copy
// must exist for every evicted chunk, so the budget caps what is locked, not
// what is kept.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "allocator/device/device.h"

namespace spillway {

struct HostBlock {
  void* data = nullptr;
  std::size_t bytes = 0;
  bool pinned = false;
};

struct HostPoolStats {
  std::size_t pinned_bytes = 0;    // held from the device, in use or cached
  std::size_t pageable_bytes = 0;  // held from the heap, in use or cached
  std::size_t in_use_bytes = 0;    // handed out and not given back
  std::size_t cached_bytes = 0;    // given back, kept for reuse
  std::uint64_t pin_failures = 0;
};

class HostPool {
 public:
  HostPool(Device& device, std::size_t pinned_budget_bytes);
  ~HostPool();  // returns every block, handed out or cached

  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of at least `bytes`, 4 KiB aligned, contents undefined. Fails
  // only when the heap itself is exhausted (out_of_memory).
  Status allocate(std::size_t bytes, HostBlock* block);
  // The block's memory must not be in use by any copy any more.
  void deallocate(const HostBlock& block);
  // Returns the cached blocks to the device and the heap.
  void release_cached();

  HostPoolStats stats() const;
  std::size_t pinned_budget_bytes() const { return pinned_budget_bytes_; }

 private:
  // Sizes are rounded to this, so blocks of nearby sizes can be reused.
  static constexpr std::size_t kGranularity = 4096;

  bool take_cached_locked(std::size_t bytes, bool pinned, HostBlock* block);
  void free_block_locked(const HostBlock& block);
  void release_cached_locked(bool pinned_only);

  Device& device_;
  const std::size_t pinned_budget_bytes_;

  mutable std::mutex mutex_;
  // Cached free blocks by (pinned, size).
  std::multimap<std::size_t, void*> cached_pinned_;
  std::multimap<std::size_t, void*> cached_pageable_;
  std::unordered_map<void*, HostBlock> in_use_;
  bool pinning_failed_ = false;  // Note [Pageable fallback]: sticky
  bool warned_over_budget_ = false;
  HostPoolStats stats_;
};

}  // namespace spillway
