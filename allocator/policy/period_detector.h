// PeriodDetector: the training iteration of a chunk access stream that
// nothing marks (Note [Steps found in the access stream] in planned_policy.h).
//
// It keeps the stream's recent accesses and, at each one, looks for the
// shortest period P such that the last 2P accesses are two copies of one
// sequence. A training step repeats its accesses exactly, so once two steps
// have run, P is the step, starting wherever the stream was when it was
// found. Candidates are the distances back to earlier accesses that ended
// the same kContext accesses as the latest one (a chunk alone recurs too
// often in a step: each of its tensors, forward and backward), compared by
// rolling hashes, then element by element, so that a hash collision costs
// time, never a wrong period.
//
// Coverage keeps short repeats inside a step from passing for the step: the
// period must hold every chunk of the last max(3P, kCoverageWindow)
// accesses, and nothing is taken before the history is that long, so a
// stretch that repeats a few chunks (a chunk read several times in a row,
// two tensors of one layer in turn) is not taken. A loop inside the step that
// does cover them (gradient accumulation's micro-batch) is a period while it
// lasts; the caller follows it until the stream departs, and the whole step
// is found when it has run twice, like any step: at the end of its second
// run, the last 2P accesses are its two copies and nothing shorter repeats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "allocator/chunk/chunk_types.h"

namespace spillway {

class PeriodDetector {
 public:
  // Earlier accesses with the latest one's context tried per access: bounds
  // the work per access.
  static constexpr std::size_t kMaxCandidates = 32;
  // The accesses that make an access's context.
  static constexpr std::size_t kContext = 8;
  // The fewest accesses a period's coverage is checked over (see above).
  static constexpr std::size_t kCoverageWindow = 64;

  void push(ChunkId chunk);
  // The shortest period that the last accesses repeat, covering the recent
  // chunks (see above), or nullopt.
  std::optional<std::size_t> find_period() const;

  std::size_t size() const { return chunks_.size(); }
  // Forgets the oldest accesses, keeping the latest `keep`.
  void keep_latest(std::size_t keep);
  void clear();

 private:
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);

  void append(ChunkId chunk);
  // The hash of accesses [begin, end).
  std::uint64_t window_hash(std::size_t begin, std::size_t end) const;
  bool repeats(std::size_t period) const;
  bool covers_recent_chunks(std::size_t period) const;

  std::vector<ChunkId> chunks_;
  std::vector<std::uint64_t> prefix_hash_;  // prefix_hash_[i]: of accesses [0, i)
  std::vector<std::uint64_t> powers_;       // powers_[i]: the hash's base to the i
  // An access's context is the hash of the kContext accesses ending with it.
  std::unordered_map<std::uint64_t, std::size_t> last_with_context_;
  std::vector<std::size_t> previous_with_context_;  // per access; kNone: none
};

}  // namespace spillway
