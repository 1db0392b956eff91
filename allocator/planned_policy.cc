// PlannedPolicy: Note [Planned eviction follows the traced step] (planned_policy.h).
#include "allocator/planned_policy.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace spillway {

PlannedPolicy::PlannedPolicy(int warmup_steps) : warmup_steps_(std::max(1, warmup_steps)) {}

void PlannedPolicy::on_access(ChunkId chunk) {
  lru_.on_access(chunk);
  switch (phase_) {
    case Phase::tracing:
      if (recording_overflowed_) break;
      if (recording_.size() == kMaxTracedAccesses) {
        recording_overflowed_ = true;
        std::vector<ChunkId>().swap(recording_);
        break;
      }
      recording_.push_back(chunk);
      break;
    case Phase::following:
      if (position_ < sequence_.size() && sequence_[position_] == chunk) {
        ++position_;
      } else {
        diverge();
      }
      break;
    case Phase::diverged:
      break;
  }
}

void PlannedPolicy::on_resident(ChunkId chunk) { lru_.on_resident(chunk); }

void PlannedPolicy::on_evicted(ChunkId chunk) { lru_.on_evicted(chunk); }

// A removed chunk may still be in the plan; if the step uses it, the access
// sequence departs from the plan there and the plan is dropped.
void PlannedPolicy::on_removed(ChunkId chunk) { lru_.on_removed(chunk); }

std::optional<ChunkId> PlannedPolicy::choose_victim(const EvictionCandidates& candidates) {
  if (phase_ != Phase::following) return lru_.choose_victim(candidates);
  std::optional<ChunkId> victim;
  std::size_t farthest = 0;
  for (const ChunkId chunk : lru_.recency()) {  // least recent first: ties go to it
    if (!candidates.evictable(chunk)) continue;
    const std::size_t distance = distance_to_next_use(chunk);
    if (!victim || distance > farthest) {
      victim = chunk;
      farthest = distance;
    }
    if (farthest == std::numeric_limits<std::size_t>::max()) break;  // never used again
  }
  return victim;
}

void PlannedPolicy::on_step_end() {
  switch (phase_) {
    case Phase::tracing:
      ++traced_steps_;
      if (traced_steps_ >= warmup_steps_ && !recording_overflowed_ && !recording_.empty()) {
        build_plan();
      } else {
        recording_.clear();
      }
      recording_overflowed_ = false;
      break;
    case Phase::following:
      if (position_ == sequence_.size()) {
        ++state_.planned_steps;
        position_ = 0;
        break;
      }
      diverge();  // the step ended early or late
      [[fallthrough]];
    case Phase::diverged:
      // The next step is traced again, and planned from.
      phase_ = Phase::tracing;
      traced_steps_ = warmup_steps_ - 1;
      recording_.clear();
      recording_overflowed_ = false;
      break;
  }
}

PolicyState PlannedPolicy::state() const {
  PolicyState state = state_;
  switch (phase_) {
    case Phase::tracing:
      state.phase = "tracing";
      break;
    case Phase::following:
      state.phase = "following";
      break;
    case Phase::diverged:
      state.phase = "diverged";
      break;
  }
  return state;
}

void PlannedPolicy::build_plan() {
  sequence_ = std::move(recording_);
  recording_.clear();
  uses_.clear();
  for (std::size_t i = 0; i < sequence_.size(); ++i) uses_[sequence_[i]].push_back(i);
  position_ = 0;
  phase_ = Phase::following;
  ++state_.plans_built;
}

void PlannedPolicy::diverge() {
  phase_ = Phase::diverged;
  ++state_.divergences;
  sequence_.clear();
  uses_.clear();
  position_ = 0;
}

std::size_t PlannedPolicy::distance_to_next_use(ChunkId chunk) const {
  const auto found = uses_.find(chunk);
  if (found == uses_.end()) return std::numeric_limits<std::size_t>::max();
  const std::vector<std::size_t>& positions = found->second;
  const auto next = std::lower_bound(positions.begin(), positions.end(), position_);
  if (next != positions.end()) return *next - position_;
  return sequence_.size() - position_ + positions.front();  // in the next repetition
}

}  // namespace spillway
