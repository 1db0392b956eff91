// LruPolicy: a recency list of resident chunks. An access moves a chunk to
// the back; the victim is the first chunk from the front that may be
// evicted. Chunks in compute are usually the most recent, so the walk is short.
#include "allocator/policy/lru_policy.h"

namespace spillway {

void LruPolicy::on_access(ChunkId chunk) {
  auto found = position_.find(chunk);
  if (found == position_.end()) return;  // not resident: on_resident will place it
  recency_.splice(recency_.end(), recency_, found->second);
}

void LruPolicy::on_resident(ChunkId chunk) {
  auto found = position_.find(chunk);
  if (found != position_.end()) {
    recency_.splice(recency_.end(), recency_, found->second);
    return;
  }
  position_.emplace(chunk, recency_.insert(recency_.end(), chunk));
}

void LruPolicy::on_evicted(ChunkId chunk) {
  auto found = position_.find(chunk);
  if (found == position_.end()) return;
  recency_.erase(found->second);
  position_.erase(found);
}

std::optional<ChunkId> LruPolicy::choose_victim(const EvictionCandidates& candidates) {
  for (ChunkId chunk : recency_) {
    if (candidates.evictable(chunk)) return chunk;
  }
  return std::nullopt;
}

}  // namespace spillway
