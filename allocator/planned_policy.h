// PlannedPolicy: Belady eviction from the traced access sequence (design
// section 5, `policy:planned`).
//
// Note [Planned eviction follows the traced step]:
//  - Tracing: during the first `warmup_steps` steps (a step ends at
//    on_step_end, i.e. spillway::step() or a Python optimizer's step) every
//    chunk access is recorded; meanwhile evictions are LRU's.
//  - Following: from then on the policy expects the last traced step's
//    accesses again, in the same order. Its position in that sequence gives
//    every resident chunk its next use; the victim is the evictable chunk
//    whose next use is farthest, looking past the step's end into the next
//    repetition (Belady). A chunk the step never uses goes first; ties go to
//    the least recently used.
//  - Divergence: an access other than the expected one (control flow
//    changed), or a step that ends early or late, drops the plan. The rest
//    of the step is LRU's, and the next step is traced again.
//  - Bounded memory: a step longer than kMaxTracedAccesses accesses is not
//    planned (it stays LRU's); the recording stops growing there.
// Prefetches are not planned here yet: chunks are fetched on use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "allocator/eviction_policy.h"
#include "allocator/lru_policy.h"

namespace spillway {

class PlannedPolicy final : public EvictionPolicy {
 public:
  static constexpr std::size_t kMaxTracedAccesses = 1 << 22;

  // `warmup_steps` below 1 counts as 1: a plan needs a traced step.
  explicit PlannedPolicy(int warmup_steps);

  std::string_view name() const override { return "planned"; }
  void on_access(ChunkId chunk) override;
  void on_resident(ChunkId chunk) override;
  void on_evicted(ChunkId chunk) override;
  void on_removed(ChunkId chunk) override;
  std::optional<ChunkId> choose_victim(const EvictionCandidates& candidates) override;
  void on_step_end() override;
  PolicyState state() const override;

 private:
  enum class Phase { tracing, following, diverged };

  void build_plan();
  void diverge();
  // Accesses from the current position to the chunk's next use; max() when
  // the step never uses it.
  std::size_t distance_to_next_use(ChunkId chunk) const;

  LruPolicy lru_;  // evictions while tracing or diverged; recency for ties
  int warmup_steps_;
  Phase phase_ = Phase::tracing;
  int traced_steps_ = 0;  // since the last plan was dropped
  std::vector<ChunkId> recording_;
  bool recording_overflowed_ = false;
  std::vector<ChunkId> sequence_;                               // the planned step's accesses
  std::unordered_map<ChunkId, std::vector<std::size_t>> uses_;  // positions in sequence_
  std::size_t position_ = 0;                                    // index of the next expected access
  PolicyState state_;
};

}  // namespace spillway
