// PlannedPolicy: Belady eviction from the traced access sequence (design
// section 5, `policy:planned`).
//
// Note [Planned eviction follows the traced step]
//  - Tracing: during the first `warmup_steps` steps (a step ends at
//    on_step_end, i.e. spillway::step() or a Python optimizer's step) every
//    chunk access is recorded; meanwhile evictions are LRU's. A program that
//    marks no steps has them found for it: Note [Steps found in the access
//    stream].
//  - Following: from then on the policy expects the last traced step's
//    accesses again, in the same order. Its position in that sequence gives
//    every resident chunk its next use; the victim is the evictable chunk
//    whose next use is farthest, looking past the step's end into the next
//    repetition (Belady). A chunk the step never uses goes first; ties go to
//    the least recently used.
//  - Divergence: an access other than the expected one (control flow
//    changed), or a step that ends early or late, is another kind of step
//    (Note [Steps of several kinds]): followed by a kept plan that began the
//    same way, or else traced from its start (what it did of the plan), its
//    rest under LRU, and planned from at its end.
//  - Bounded memory: a step longer than kMaxTracedAccesses accesses is not
//    planned (it stays LRU's); the recording stops growing there.
//
// Note [Steps found in the access stream]
// A program that never marks its steps (stock torch::optim in C++, with no
// spillway::step()) still repeats its accesses each iteration. Until the
// first mark, the policy keeps the stream's recent accesses (at most
// kMaxDetectionHistory) and a PeriodDetector (period_detector.h) looks at
// each access for the shortest period P whose last two copies match and
// that holds every chunk of the latest max(3P, 64) accesses. The last copy
// becomes the plan, as a traced step would, and following starts at once:
// the next access is the plan's first. Each time the stream comes round to
// the plan's first access again, a step ended: planned_steps counts it. Such
// steps stay the policy's: the chunk manager neither counts them with marked
// steps nor writes them into the trace, since a loop inside a step (below)
// can pass for the step for a while, and a trace's steps must be the
// program's. A departure drops the plan as a marked divergence does, and the
// search goes on at once, since no step end is coming to retrace from.
//
// Limits:
//  - A step is found only after it has run twice (two steps under LRU, more
//    while the two hold fewer than 64 accesses), and it begins wherever the
//    stream was when it was found.
//  - A loop inside the step is followed while it lasts: gradient
//    accumulation's micro-batch is found in each of the first two steps and
//    departed from at the optimizer (a divergence each time); the whole step
//    is found at the end of the second, like any step.
//  - A step whose accesses vary from one iteration to the next (data-dependent
//    control flow) has no period and stays under LRU.
//  - The first mark ends all of this: the program marks its steps, so
//    detection stops, anything it planned is dropped, the counts restart,
//    and the stream since the start is the first traced step, exactly as if
//    detection had never run (unless the history was cut at
//    kMaxDetectionHistory: then the next step is traced).
//
// Note [Steps of several kinds]
// A program may repeat more than one kind of step: an actor's and a critic's
// optimizer steps in turns (RLHF), a training step and an evaluation pass.
// Each ends at a mark, and each differs from the other from its first
// access. So a marked step whose first access is not the plan's first is not
// a departure: the plan is shelved (the latest kMaxShelvedPlans are kept,
// with at most kMaxTracedAccesses accesses among them), and the step is
// followed by the shelved plan that begins with that access or, if none
// does, traced from that access and planned from at its end. The same holds
// at any access: a step that departs from the plan after k accesses (the
// actor's step, which first runs the critic's forward as the critic's step
// does) is followed by a shelved plan whose first k accesses are the same
// and whose next is this one; if none is, the k accesses and this one begin
// the step's trace (divergences counts it), and the plan is shelved. A step
// that ends early is a plan of its own at once. Switching builds no plan
// (plans_built), and a switched-to step counts as planned. Belady's look
// past the step's end still assumes the same kind of step comes next. A step
// whose accesses vary without repeating keeps tracing, under LRU.
//
// Note [Planned prefetch]
// While following, the policy names the first chunk of the coming accesses
// (looking up to kPrefetchLookahead accesses ahead, or a whole step when
// prefetches are timed, into the next step) that
// is not on the device and is next used there (not by acquire_host), and the
// chunk manager starts fetching it at once, as early as the plan allows, so
// that its copy overlaps the work before its use instead of stalling the
// access. Room for it comes from free budget, or from the chunk that Belady
// would evict at the incoming chunk's use (the resident chunk whose next use
// from there is farthest), if nothing uses that chunk before then: its
// eviction moves earlier, and the prefetch moves the same fetch earlier, so a
// step moves the same bytes as fetching on use (the planner's "the victim
// leaves right after its last use; the fetch starts then",
// tracer/planner/planner.h). Otherwise nothing is prefetched yet (the copy
// streams are FIFOs, so a later chunk does not jump the queue either); the
// manager asks again after the next acquire and release, and at a step's end
// for the next step.
//
// Note [Write-backs ahead of spills]
// An allocation that finds the device full spills chunks (Note [Evicting
// under pressure] in chunk_manager.cc), and a dirty victim's memory is free
// only once its write-back is done: the allocation waits for a whole copy.
// The traced step says where allocations spilled (on_spill, at the access
// they came before) and how many chunks each took. While following, the
// policy names the chunks Belady would evict at the next such spill
// (spill_victims_ahead: farthest next use from there, among the resident
// chunks), and kSpareSpillVictims more, less those in use now or written
// before the spill (cleaning them would be undone; they are named once their
// last write is done), and the chunk manager writes the dirty ones back
// early, one at a time on the write-back stream, keeping their device
// copies. The spill then finds them clean and frees them without a wait. A
// chunk written again before it is evicted is only dirty again (a writer
// waits for the write-back reading its bytes); the cost of a wrong guess is
// one copy on the otherwise idle write-back stream.
//  - The spills expected are those of the latest followed step that spilled
//    (the traced step's until then). The traced step ran under LRU, whose
//    residency spills elsewhere: on the demo's GPT with torch's Adam at 52
//    MiB (bench_train), the traced step spilled before access 320 and every
//    followed step before accesses 119 and 248, so no write-back ahead ever
//    met a spill, and the spills waited 8 ms a step for their victims'
//    write-backs. A step that spills nowhere keeps the expectation, so that
//    a step whose write-backs ahead avoided nothing does not drop them.
//  - The spare victims: a prefetch started before the spill, for a chunk
//    used after it, takes Belady's victim from there, the chunk named first,
//    and the spill then takes the next one, dirty. A spare is named only
//    once the spill's own victims are: its write-back, started first, held
//    up theirs (a chunk-manager test caught it, 1 in several runs). There it waited for a
//    whole write-back (3 ms of a 40 ms step at 52 MiB) after the prefetch
//    took the clean one (bench_train: with one spare the spills' waits fell
//    from 4.0-4.5 to 2.6 ms a step at 52 MiB and from 19-23 to 12-19 ms at
//    42 MiB; two or three spares measured no better than one).
//
// When the fetch starts: Note [Prefetch timed by op durations]
// (prefetch_timing.h). With the traced step's times, timed_prefetch() holds a
// fetch back while a later start still lands it before its use.
//
// Note [Room a prefetch takes early]
// A fetch takes its room from when it starts to its use. If activations grow
// in between past the room the device has left, the allocator spills a chunk
// for them. When every other resident chunk is used before the incoming
// one, Belady's victim for that spill is the incoming chunk itself: it is
// evicted while its copy may still be in flight (the spill waits for it),
// fetched again when room comes back, and evicted again at the next rise.
// On the demo's GPT with spillway's Adam, a chunk used by the optimizer went
// three times a step through that loop. So the traced step also records, at
// each access, the most non-model bytes since the access before
// (note_non_model_high_water, from the allocator's high-water mark), and a
// timed fetch that must start now is held back while:
//  - between now and its use, non-model bytes are traced to grow past
//    today's (CopyClock::non_model_bytes) by more than the room the device
//    would have left with the chunk in (CopyClock::room_bytes, in whole small
//    slabs, since an activation that fits no cached fragment takes a new
//    slab). Up to the use's access: once the use's op holds the chunk, its
//    own allocations spill another. A rise no higher than the one at the use
//    counts too: the spill at the use takes a chunk whose uses are over, one
//    before it takes the incoming chunk in flight (the optimizer of the demo's
//    GPT with torch's Adam, whose temporaries rise to the same level at every
//    parameter, spilled a chunk it prefetched three times before its use);
//  - and the fetch has no victim of its own: Belady's choice at its use
//    (Note [Planned prefetch]) is used before then; or, where the fetch must
//    evict a chunk to come in (CopyClock::fits_without_eviction), so is its
//    second choice, as the first leaves for the fetch, not for the peak (the
//    same optimizer: a fetch took the one chunk done until its use, and the
//    temporaries' next slab spilled the fetch in flight). The room for the
//    peak then comes from the chunks used before the incoming one, or from
//    the incoming chunk itself, which a spill takes as soon as the others
//    have had their last use before it.
// It starts once the peak is behind it, or on use. Where the fetch has a
// victim, that chunk leaves for the peak instead, as it would at the use,
// and the fetch is not held: holding every fetch under a peak measured
// worse on the demo's GPT with torch's Adam (docs/benchmarks.md,
// bench_train): the stall doubled and the same bytes moved.
// Timed fetches look a whole step ahead: the timing and this rule, not a
// count of accesses, decide when each starts. The fixed window of 64
// accesses started the copy of a chunk used after a dense backward 1.5 ms
// before its use (11 ms of copy). The accesses known resident from the
// current position on are remembered until an eviction, so looking ahead
// costs little per access when everything ahead is on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "allocator/policy/eviction_policy.h"
#include "allocator/policy/lru_policy.h"
#include "allocator/policy/period_detector.h"
#include "allocator/policy/prefetch_timing.h"
#include "allocator/policy/range_max.h"

namespace spillway {

class PlannedPolicy final : public EvictionPolicy {
 public:
  static constexpr std::size_t kMaxTracedAccesses = 1 << 22;
  // How far ahead an untimed prefetch looks (Note [Planned prefetch]); a
  // chunk needed later than this is fetched by a later access. Timed ones
  // look a whole step ahead (Note [Room a prefetch takes early]).
  static constexpr std::size_t kPrefetchLookahead = 64;
  // How far ahead a spill's victims are written back (Note [Write-backs
  // ahead of spills]): bounds the work per access (a ranking of the resident
  // chunks) to the accesses before a spill.
  static constexpr std::size_t kWriteBackLookahead = 256;
  // Victims named beyond a spill's own (Note [Write-backs ahead of spills]).
  static constexpr std::size_t kSpareSpillVictims = 1;
  // Note [Steps found in the access stream]: the accesses kept to find the
  // step in (the oldest half goes when full), so the longest step found.
  static constexpr std::size_t kMaxDetectionHistory = 1 << 19;
  // Note [Steps of several kinds]: the plans kept for other kinds of step.
  static constexpr std::size_t kMaxShelvedPlans = 4;

  // `warmup_steps` below 1 counts as 1: a plan needs a traced step.
  explicit PlannedPolicy(int warmup_steps);

  std::string_view name() const override { return "planned"; }
  void on_access(ChunkId chunk) override;
  void on_host_access(ChunkId chunk) override;
  void on_resident(ChunkId chunk) override;
  void on_evicted(ChunkId chunk) override;
  void on_removed(ChunkId chunk) override;
  std::optional<ChunkId> choose_victim(const EvictionCandidates& candidates) override;
  void on_step_end() override;
  void note_time(std::uint64_t now_ns) override { now_ns_ = now_ns; }
  void note_access_writes(bool writes) override { access_writes_ = writes; }
  void note_non_model_high_water(std::uint64_t bytes) override { non_model_high_water_ = bytes; }
  void on_spill(std::size_t chunks) override;
  std::vector<ChunkId> spill_victims_ahead(const EvictionCandidates& candidates) const override;
  std::optional<ChunkId> prefetch_candidate() const override;
  std::optional<PlannedFetch> timed_prefetch(const CopyClock& clock) const override;
  // True while following a plan whose traced step has op durations (its
  // clock moved): timed_prefetch() then times fetches.
  bool timed() const { return phase_ == Phase::following && step_ns_ > 0; }
  std::optional<ChunkId> choose_victim_for_prefetch(const EvictionCandidates& candidates,
                                                    ChunkId incoming) override;
  PolicyState state() const override;

 private:
  enum class Phase { tracing, following, diverged };

  struct Access {
    ChunkId chunk;
    bool on_host;           // acquire_host, not acquire: never prefetched
    std::uint64_t time_ns;  // note_time's clock; in sequence_, from the step's first access
    bool writes;            // note_access_writes
    std::uint64_t non_model_high_water;  // Note [Room a prefetch takes early]
  };
  // Note [Write-backs ahead of spills]: an allocation that spilled in the
  // traced step (or the latest followed one), just before the access at
  // `position`.
  struct Spill {
    std::size_t position;
    std::size_t chunks;  // how many it evicted
  };
  struct Candidate {
    ChunkId chunk;
    std::size_t ahead;  // accesses from the current position to its use
  };

  void record_or_follow(Access access);
  // The access the plan expects next, or a divergence.
  void follow(const Access& access);
  // Note [Steps found in the access stream]: an access before the first mark.
  void follow_unmarked(const Access& access);
  void remember_unmarked(const Access& access);
  void install_detected_plan(std::size_t period);
  // The first mark: steps are the program's from now on.
  void start_marked_steps();
  // Note [Planned prefetch]: the next chunk to bring in, if any.
  std::optional<Candidate> next_prefetch(std::size_t lookahead) const;
  // Note [Prefetch timed by op durations]: the fetches that will queue behind
  // `first` on the fetch stream, in order of use, with their predicted uses.
  std::vector<QueuedFetch> fetches_behind(const Candidate& first, std::uint64_t first_copy_ns,
                                          const CopyClock& clock) const;
  // Note [Room a prefetch takes early]: whether non-model bytes are traced to
  // grow past `now` (today's) plus `room` before the access `ahead` on, up
  // to that access.
  bool crowded_before(std::size_t ahead, std::uint64_t now, std::uint64_t room) const;
  // Whether Belady's `wanted` victims at the access `ahead` on (the resident
  // chunks next used farthest from there) are unused until then: chunks that
  // may leave early to make room (Note [Planned prefetch]).
  bool victims_at_use(std::size_t ahead, std::size_t wanted) const;
  // The clock's predicted time of the access at sequence index `index`
  // (past the end: the next repetition), from the latest access.
  std::uint64_t predicted_ns(std::size_t index) const;
  void build_plan();
  // The plan of `sequence` (times from its first access), followed from now.
  void install_plan(std::vector<Access> sequence, std::vector<Spill> spills, std::uint64_t step_ns);
  void diverge();
  // Note [Steps of several kinds]: puts the plan aside (nothing to follow
  // until another is installed), or takes up the shelved plan that begins
  // with `first`; false when there is none.
  void shelve_plan();
  // Takes up the shelved plan whose first accesses are `prefix` and then
  // `next` (without `next`: exactly `prefix`), positioned after them; false
  // when none is.
  bool switch_plan(const std::vector<Access>& prefix, std::optional<Access> next);
  // The step so far (the plan's accesses up to position_), then `access`,
  // become the recording of a traced step; the plan is shelved.
  void trace_from_here(std::optional<Access> access);
  // Accesses from the current position to the chunk's next use; max() when
  // the step never uses it.
  std::size_t distance_to_next_use(ChunkId chunk) const;
  // The same from sequence index `from` (past the end: the next repetition).
  std::size_t distance_from(std::size_t from, ChunkId chunk) const;
  // True when an access in [from, to) (sequence indices, `to` possibly in the
  // next repetition) may write the chunk.
  bool written_between(ChunkId chunk, std::size_t from, std::size_t to) const;
  struct Victim {
    ChunkId chunk;
    std::size_t next_use;  // distance_from(from, chunk)
  };
  // The resident chunk whose next use from sequence index `from` is
  // farthest, among those `candidates` accepts (every one when null); ties go
  // to the least recently used.
  std::optional<Victim> farthest_next_use(std::size_t from,
                                          const EvictionCandidates* candidates) const;

  LruPolicy lru_;  // evictions while tracing or diverged; recency for ties
  int warmup_steps_;
  Phase phase_ = Phase::tracing;
  int traced_steps_ = 0;  // since the last plan was dropped
  std::vector<Access> recording_;
  std::vector<Spill> recorded_spills_;  // the traced step's, in order
  bool recording_overflowed_ = false;
  std::vector<Access> sequence_;                                // the planned step's accesses
  std::unordered_map<ChunkId, std::vector<std::size_t>> uses_;  // positions in sequence_
  std::vector<Spill> spills_;  // the planned step's (Note [Write-backs ahead of spills])
  std::size_t position_ = 0;   // index of the next expected access
  // Note [Steps of several kinds]: plans of other kinds of step, oldest first.
  struct ShelvedPlan {
    std::vector<Access> sequence;
    std::vector<Spill> spills;
    std::uint64_t step_ns;
  };
  std::vector<ShelvedPlan> shelved_;
  std::size_t shelved_accesses_ = 0;
  std::vector<Spill> step_spills_;  // while following: this step's, for a departure's trace
  PolicyState state_;
  // Note [Steps found in the access stream]. Before the first mark,
  // recording_ and recorded_spills_ hold the stream since the start (or its
  // latest kMaxDetectionHistory accesses) in every phase.
  bool steps_marked_ = false;  // on_step_end has been called
  PeriodDetector detector_;
  bool history_trimmed_ = false;  // recording_ lost its oldest accesses
  // Note [Prefetch timed by op durations].
  bool access_writes_ = false;       // the latest note_access_writes
  std::uint64_t now_ns_ = 0;         // the latest note_time
  std::uint64_t step_ns_ = 0;        // the planned step's length; 0: not timed
  std::uint64_t ref_real_ns_ = 0;    // the latest access (or step end) on the clock
  std::uint64_t ref_traced_ns_ = 0;  // ... and in the planned step's time
  // Note [Room a prefetch takes early].
  std::uint64_t non_model_high_water_ = 0;  // the latest note_non_model_high_water
  RangeMax high_waters_;                    // sequence_'s non_model_high_water
  // Sequence indices [resident_from_, resident_until_) are device accesses
  // of resident chunks (none on the host); reset by every eviction.
  mutable std::size_t resident_from_ = 0;
  mutable std::size_t resident_until_ = 0;
  // Note [Prefetch timed by op durations]: how long before its use the
  // candidate fetch must arrive for the fetches behind it, kept until a
  // chunk arrives or leaves or the position starts over.
  struct BehindCache {
    ChunkId chunk;
    std::size_t use;  // position_ + ahead of its use
    std::uint64_t lead_ns;
  };
  mutable std::optional<BehindCache> behind_cache_;
};

}  // namespace spillway
