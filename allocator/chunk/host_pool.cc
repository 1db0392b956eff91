// HostPool: pinned blocks within a budget, cached by size; pageable memory
// when pinning fails or the budget is spent (Note [Pageable fallback] in
// host_pool.h).
#include "allocator/chunk/host_pool.h"

#include <cstdlib>
#include <vector>

#include "allocator/config/format_bytes.h"
#include "allocator/config/log.h"

namespace spillway {
namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

HostPool::HostPool(Device& device, std::size_t pinned_budget_bytes)
    : device_(device), pinned_budget_bytes_(pinned_budget_bytes) {}

HostPool::~HostPool() {
  std::lock_guard lock(mutex_);
  std::vector<HostBlock> in_use;
  for (const auto& [data, block] : in_use_) in_use.push_back(block);
  for (const HostBlock& block : in_use) free_block_locked(block);
  in_use_.clear();
  release_cached_locked(/*pinned_only=*/false);
}

Status HostPool::allocate(std::size_t bytes, HostBlock* block) {
  *block = {};
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes, kGranularity);
  std::lock_guard lock(mutex_);
  if (!take_cached_locked(size, /*pinned=*/true, block)) {
    if (!pinning_failed_ && stats_.pinned_bytes + size > pinned_budget_bytes_) {
      // Cached pinned blocks of other sizes make way before we give up pinning.
      release_cached_locked(/*pinned_only=*/true);
    }
    if (!pinning_failed_ && stats_.pinned_bytes + size <= pinned_budget_bytes_) {
      void* data = nullptr;
      const Status status = device_.host_malloc(&data, size);
      if (status == Status::ok && data != nullptr) {
        *block = {data, size, true};
        stats_.pinned_bytes += size;
      } else {
        pinning_failed_ = true;
        ++stats_.pin_failures;
        SPILLWAY_LOG(warn,
                     "pinning {} of host memory failed ({}{}{}); chunk host copies use pageable "
                     "memory from now on, so moves are slower (raise the memlock limit, ulimit "
                     "-l, to pin)",
                     format_bytes(size), to_string(status),
                     device_.last_error().empty() ? "" : ": ", device_.last_error());
      }
    } else if (!pinning_failed_ && !warned_over_budget_) {
      warned_over_budget_ = true;
      SPILLWAY_LOG(warn,
                   "host_budget of {} pinned memory is spent ({} pinned); further chunk host "
                   "copies use pageable memory, so their moves are slower",
                   format_bytes(pinned_budget_bytes_), format_bytes(stats_.pinned_bytes));
    }
  }
  if (block->data == nullptr && !take_cached_locked(size, /*pinned=*/false, block)) {
    void* data = std::aligned_alloc(kGranularity, size);
    if (data == nullptr) return Status::out_of_memory;
    *block = {data, size, false};
    stats_.pageable_bytes += size;
  }
  in_use_.emplace(block->data, *block);
  stats_.in_use_bytes += block->bytes;
  return Status::ok;
}

bool HostPool::take_cached_locked(std::size_t bytes, bool pinned, HostBlock* block) {
  auto& cache = pinned ? cached_pinned_ : cached_pageable_;
  auto found = cache.find(bytes);
  if (found == cache.end()) return false;
  *block = {found->second, bytes, pinned};
  cache.erase(found);
  stats_.cached_bytes -= bytes;
  return true;
}

void HostPool::deallocate(const HostBlock& block) {
  if (block.data == nullptr) return;
  std::lock_guard lock(mutex_);
  auto found = in_use_.find(block.data);
  if (found == in_use_.end()) return;
  const HostBlock held = found->second;
  in_use_.erase(found);
  stats_.in_use_bytes -= held.bytes;
  (held.pinned ? cached_pinned_ : cached_pageable_).emplace(held.bytes, held.data);
  stats_.cached_bytes += held.bytes;
}

void HostPool::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked(/*pinned_only=*/false);
}

void HostPool::release_cached_locked(bool pinned_only) {
  for (const auto& [bytes, data] : cached_pinned_) {
    free_block_locked({data, bytes, true});
    stats_.cached_bytes -= bytes;
  }
  cached_pinned_.clear();
  if (pinned_only) return;
  for (const auto& [bytes, data] : cached_pageable_) {
    free_block_locked({data, bytes, false});
    stats_.cached_bytes -= bytes;
  }
  cached_pageable_.clear();
}

void HostPool::free_block_locked(const HostBlock& block) {
  if (block.pinned) {
    device_.host_free(block.data);
    stats_.pinned_bytes -= block.bytes;
  } else {
    std::free(block.data);
    stats_.pageable_bytes -= block.bytes;
  }
}

HostPoolStats HostPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace spillway
