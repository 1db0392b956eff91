// EvictionPolicy: which resident chunk leaves the device when room is needed.
//
// The chunk manager decides *whether* to evict (a fetch needs room, the
// allocator is under pressure) and which chunks *may* go (resident, nobody
// computing on them); the policy only picks among those. It is told what
// it needs to rank them: every access, and chunks arriving on and leaving
// the device. That fits LRU (lru_policy.h) and the planned policy of design
// section 5, which replays the traced access sequence and evicts the chunk
// whose next use is farthest (Belady).
//
// All calls come with the chunk manager's lock held, one at a time, so a
// policy needs no locking of its own; it must not call the manager.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "allocator/chunk/chunk_types.h"

namespace spillway {

// What a policy reports about itself (memory_stats_json's "policy").
struct PolicyState {
  const char* phase = "";          // planned: "tracing", "following" or "diverged"
  std::int64_t plans_built = 0;    // planned: plans made from a traced step
  std::int64_t divergences = 0;    // planned: steps that departed from the plan
  std::int64_t planned_steps = 0;  // planned: steps that followed the plan to the end
  // planned: the followed plan's length in accesses when its step was found in
  // the access stream (nothing marks steps); 0 otherwise.
  std::int64_t detected_period = 0;
};

// What the chunk manager knows of copy time, for a policy that times its
// prefetches (Note [Prefetch timed by op durations] in prefetch_timing.h).
class CopyClock {
 public:
  // Device::now_ns().
  virtual std::uint64_t now_ns() const = 0;
  // When the stream that would bring the chunk in is modelled to finish
  // the work queued on it so far: the fetch stream's fetches, or now for a
  // chunk that is zeroed rather than copied (its fill has a stream of its own).
  virtual std::uint64_t stream_free_at_ns(ChunkId chunk) const = 0;
  // Whether the chunk's fetch queues on the fetch stream (a copy of its
  // bytes), not a zero fill on a stream of its own.
  virtual bool queues_on_fetch_stream(ChunkId chunk) const = 0;
  // Whether copy times are modelled (the copy bandwidth is known); when not,
  // prefetches are not timed.
  virtual bool copies_modelled() const = 0;
  // Modelled time to fetch the chunk; nullopt when the copy bandwidth is
  // unknown.
  virtual std::optional<std::uint64_t> fetch_ns(ChunkId chunk) const = 0;
  // Note [Room a prefetch takes early]: the bytes other allocations may take
  // once the chunk is on the device before the device is full, and the
  // non-model bytes allocated now.
  virtual std::uint64_t room_bytes(ChunkId chunk) const = 0;
  virtual std::uint64_t non_model_bytes() const = 0;
  // Whether the chunk's device copy would fit now without evicting another.
  virtual bool fits_without_eviction(ChunkId chunk) const = 0;

 protected:
  ~CopyClock() = default;
};

// A prefetch the policy wants started now.
struct PlannedFetch {
  ChunkId chunk;
  // How late it is modelled to arrive after its use (0: in time; also 0 when
  // the prefetch is not timed).
  std::uint64_t expected_stall_ns = 0;
};

// The chunk manager's view of which chunks may be evicted right now.
class EvictionCandidates {
 public:
  // True for a chunk resident on the device that no caller is using.
  virtual bool evictable(ChunkId chunk) const = 0;

 protected:
  ~EvictionCandidates() = default;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;

  // The clock (Device::now_ns()) just before an access or a step end; a
  // policy that times prefetches measures the traced step with it.
  virtual void note_time(std::uint64_t now_ns) { (void)now_ns; }
  // Just before an access: whether it may write the chunk (AccessMode
  // read_write; host accesses that write included).
  virtual void note_access_writes(bool writes) { (void)writes; }
  // Before on_access: the most non-model bytes allocated since the access
  // before (Note [Room a prefetch takes early] in planned_policy.h).
  virtual void note_non_model_high_water(std::uint64_t bytes) { (void)bytes; }
  // A chunk was acquired (on the device or the host). Prefetches are not
  // accesses.
  virtual void on_access(ChunkId chunk) = 0;
  // An access on the host (ChunkManager::acquire_host): the same to most
  // policies; a planned prefetch must not bring such a chunk to the device.
  virtual void on_host_access(ChunkId chunk) { on_access(chunk); }
  // A chunk got a device copy (fetched or prefetched).
  virtual void on_resident(ChunkId chunk) = 0;
  // A chunk's device copy went away (evicted, discarded, removed).
  virtual void on_evicted(ChunkId chunk) = 0;
  // A chunk no longer exists (its client was removed, or it was re-laid).
  virtual void on_removed(ChunkId chunk) { on_evicted(chunk); }

  // The chunk to evict among the resident ones `candidates` accepts, or
  // nullopt when none is acceptable (or the policy never evicts).
  virtual std::optional<ChunkId> choose_victim(const EvictionCandidates& candidates) = 0;

  // An allocation spilled `chunks` chunks just now (ChunkManager::relieve_pressure).
  virtual void on_spill(std::size_t chunks) { (void)chunks; }
  // A training step ended (ChunkManager::end_step).
  virtual void on_step_end() {}
  // Planned prefetch (Note [Planned prefetch] in planned_policy.h): the next
  // chunk the policy wants on the device ahead of its use, or nullopt.
  virtual std::optional<ChunkId> prefetch_candidate() const { return std::nullopt; }
  // The same, timed (Note [Prefetch timed by op durations] in
  // prefetch_timing.h): nullopt also while the next chunk can start later and
  // still arrive before its use.
  virtual std::optional<PlannedFetch> timed_prefetch(const CopyClock& clock) const {
    (void)clock;
    const std::optional<ChunkId> chunk = prefetch_candidate();
    if (!chunk) return std::nullopt;
    return PlannedFetch{*chunk};
  }
  // The chunk to evict for prefetching `incoming`, or nullopt when evicting
  // any acceptable one would cost a fetch the prefetch does not save.
  virtual std::optional<ChunkId> choose_victim_for_prefetch(const EvictionCandidates& candidates,
                                                            ChunkId incoming) {
    (void)candidates;
    (void)incoming;
    return std::nullopt;
  }
  // Note [Write-backs ahead of spills] in planned_policy.h: of the chunks the
  // next spill the policy expects will evict, and its spares, those that may
  // be written back now (`candidates` accepts them, and nothing writes them
  // before the spill), farthest next use first; empty when it expects none.
  virtual std::vector<ChunkId> spill_victims_ahead(const EvictionCandidates& candidates) const {
    (void)candidates;
    return {};
  }
  virtual PolicyState state() const { return {}; }
};

// Never evicts: the `static` policy, where going over budget is an error.
class NoEvictionPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "static"; }
  void on_access(ChunkId) override {}
  void on_resident(ChunkId) override {}
  void on_evicted(ChunkId) override {}
  std::optional<ChunkId> choose_victim(const EvictionCandidates&) override { return std::nullopt; }
};

}  // namespace spillway
