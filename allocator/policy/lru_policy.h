// LruPolicy: evicts the resident chunk accessed longest ago.
#pragma once

#include <list>
#include <unordered_map>

#include "allocator/policy/eviction_policy.h"

namespace spillway {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void on_access(ChunkId chunk) override;
  void on_resident(ChunkId chunk) override;
  void on_evicted(ChunkId chunk) override;
  std::optional<ChunkId> choose_victim(const EvictionCandidates& candidates) override;

  // Resident chunks, least recently used first (PlannedPolicy breaks ties by it).
  const std::list<ChunkId>& recency() const { return recency_; }
  bool resident(ChunkId chunk) const { return position_.contains(chunk); }

 private:
  // Resident chunks, least recently used first.
  std::list<ChunkId> recency_;
  std::unordered_map<ChunkId, std::list<ChunkId>::iterator> position_;
};

}  // namespace spillway
