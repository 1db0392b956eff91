// CacheModel: a device that holds `capacity` chunks, driven by a policy the
// way the chunk manager drives it: a missing chunk is fetched (evicting the
// policy's victim when full), then accessed. For policy tests that count
// misses without a chunk manager.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "allocator/policy/eviction_policy.h"

namespace spillway::testing {

class CacheModel final : public EvictionCandidates {
 public:
  CacheModel(EvictionPolicy& policy, std::size_t capacity) : policy_(policy), capacity_(capacity) {}

  bool evictable(ChunkId id) const override { return resident_.count(id) && id != in_use_; }

  // Returns whether the access missed.
  bool access(ChunkId id) {
    const bool miss = resident_.count(id) == 0;
    if (miss) {
      in_use_ = id;
      if (resident_.size() == capacity_) {
        const std::optional<ChunkId> victim = policy_.choose_victim(*this);
        EXPECT_TRUE(victim.has_value());
        resident_.erase(*victim);
        policy_.on_evicted(*victim);
      }
      resident_.insert(id);
      policy_.on_resident(id);
    }
    policy_.on_access(id);
    return miss;
  }

  // The accesses, then a step mark; the misses.
  int run_step(const std::vector<int>& accesses) {
    const int misses = run(accesses).misses;
    policy_.on_step_end();
    return misses;
  }

  struct Run {
    int misses = 0;
    // Indices of the accesses at which the policy counted a planned step
    // (a step it found in the stream began there).
    std::vector<std::size_t> step_ends;
  };
  // The accesses, with no step mark.
  Run run(const std::vector<int>& accesses) {
    Run result;
    for (std::size_t i = 0; i < accesses.size(); ++i) {
      const std::int64_t planned_steps = policy_.state().planned_steps;
      result.misses += access(static_cast<ChunkId>(accesses[i])) ? 1 : 0;
      if (policy_.state().planned_steps != planned_steps) result.step_ends.push_back(i);
    }
    return result;
  }

  const std::set<ChunkId>& resident() const { return resident_; }

 private:
  EvictionPolicy& policy_;
  std::size_t capacity_;
  std::set<ChunkId> resident_;
  ChunkId in_use_{};
};

}  // namespace spillway::testing
