// PlannedPolicy: Note [Planned eviction follows the traced step] (planned_policy.h).
#include "allocator/policy/planned_policy.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "allocator/policy/prefetch_timing.h"

namespace spillway {

PlannedPolicy::PlannedPolicy(int warmup_steps) : warmup_steps_(std::max(1, warmup_steps)) {}

void PlannedPolicy::on_access(ChunkId chunk) {
  record_or_follow({chunk, /*on_host=*/false, now_ns_, access_writes_, non_model_high_water_});
}

void PlannedPolicy::on_host_access(ChunkId chunk) {
  record_or_follow({chunk, /*on_host=*/true, now_ns_, access_writes_, non_model_high_water_});
}

void PlannedPolicy::record_or_follow(Access access) {
  lru_.on_access(access.chunk);
  if (!steps_marked_) {
    follow_unmarked(access);
    return;
  }
  switch (phase_) {
    case Phase::tracing:
      // Note [Steps of several kinds]: a step that begins as a shelved plan
      // does is followed by it.
      if (recording_.empty() && switch_plan({}, access)) break;
      if (recording_overflowed_) break;
      if (recording_.size() == kMaxTracedAccesses) {
        recording_overflowed_ = true;
        std::vector<Access>().swap(recording_);
        break;
      }
      recording_.push_back(access);
      break;
    case Phase::following:
      follow(access);
      break;
    case Phase::diverged:
      break;
  }
}

// Note [Steps of several kinds]: the access the plan expects next, the next
// of a shelved plan that began as this step did, or another kind of step.
void PlannedPolicy::follow(const Access& access) {
  if (position_ < sequence_.size() && sequence_[position_].chunk == access.chunk) {
    ref_traced_ns_ = sequence_[position_].time_ns;
    ref_real_ns_ = now_ns_;
    ++position_;
    return;
  }
  const std::vector<Access> prefix(sequence_.begin(),
                                   sequence_.begin() + static_cast<std::ptrdiff_t>(position_));
  if (switch_plan(prefix, access)) return;
  if (position_ > 0) ++state_.divergences;  // a step that begins elsewhere departs from nothing
  trace_from_here(access);
}

void PlannedPolicy::trace_from_here(std::optional<Access> access) {
  // The step so far is the plan's first position_ accesses, on the step's clock.
  const std::uint64_t start_ns = ref_real_ns_ - std::min(ref_real_ns_, ref_traced_ns_);
  std::vector<Access> recording(sequence_.begin(),
                                sequence_.begin() + static_cast<std::ptrdiff_t>(position_));
  for (Access& traced : recording) traced.time_ns += start_ns;
  std::vector<Spill> spills = std::move(step_spills_);
  step_spills_.clear();
  if (access) recording.push_back(*access);
  shelve_plan();
  position_ = 0;
  behind_cache_.reset();
  phase_ = Phase::tracing;
  traced_steps_ = warmup_steps_ - 1;
  recording_ = std::move(recording);
  recorded_spills_ = std::move(spills);
  recording_overflowed_ = false;
}

// Note [Steps of several kinds].
void PlannedPolicy::shelve_plan() {
  if (sequence_.empty()) return;
  shelved_accesses_ += sequence_.size();
  shelved_.push_back({std::move(sequence_), std::move(spills_), step_ns_});
  while (shelved_.size() > kMaxShelvedPlans || shelved_accesses_ > kMaxTracedAccesses) {
    shelved_accesses_ -= shelved_.front().sequence.size();
    shelved_.erase(shelved_.begin());
  }
  sequence_.clear();
  spills_.clear();
  uses_.clear();
  step_ns_ = 0;
}

bool PlannedPolicy::switch_plan(const std::vector<Access>& prefix, std::optional<Access> next) {
  const std::size_t length = prefix.size() + (next ? 1 : 0);
  const auto begins_so = [&](const ShelvedPlan& plan) {
    if (next ? plan.sequence.size() < length : plan.sequence.size() != length) return false;
    if (next && plan.sequence[prefix.size()].chunk != next->chunk) return false;
    return std::equal(prefix.begin(), prefix.end(), plan.sequence.begin(),
                      [](const Access& a, const Access& b) { return a.chunk == b.chunk; });
  };
  const auto found = std::ranges::find_if(shelved_, begins_so);
  if (found == shelved_.end()) return false;
  ShelvedPlan plan = std::move(*found);
  shelved_.erase(found);
  shelved_accesses_ -= plan.sequence.size();
  shelve_plan();
  const std::int64_t built = state_.plans_built;
  install_plan(std::move(plan.sequence), std::move(plan.spills), plan.step_ns);
  state_.plans_built = built;  // not a new plan
  position_ = length;
  ref_traced_ns_ = length == 0 ? 0 : sequence_[length - 1].time_ns;
  return true;
}

// Note [Steps found in the access stream].
void PlannedPolicy::follow_unmarked(const Access& access) {
  remember_unmarked(access);
  if (phase_ == Phase::following) {
    if (position_ == sequence_.size() && sequence_.front().chunk == access.chunk) {
      ++state_.planned_steps;  // round to the plan's first access: a step ended
      position_ = 0;
      behind_cache_.reset();
    }
    if (position_ < sequence_.size() && sequence_[position_].chunk == access.chunk) {
      ref_traced_ns_ = sequence_[position_].time_ns;
      ref_real_ns_ = now_ns_;
      ++position_;
      return;
    }
    diverge();
    phase_ = Phase::tracing;  // no step end is coming: look again at once
  }
  if (const std::optional<std::size_t> period = detector_.find_period())
    install_detected_plan(*period);
}

void PlannedPolicy::remember_unmarked(const Access& access) {
  recording_.push_back(access);
  detector_.push(access.chunk);
  if (recording_.size() <= kMaxDetectionHistory) return;
  const std::size_t keep = kMaxDetectionHistory / 2;
  const std::size_t dropped = recording_.size() - keep;
  recording_.erase(recording_.begin(), recording_.begin() + static_cast<std::ptrdiff_t>(dropped));
  detector_.keep_latest(keep);
  std::erase_if(recorded_spills_, [&](const Spill& spill) { return spill.position < dropped; });
  for (Spill& spill : recorded_spills_) spill.position -= dropped;
  history_trimmed_ = true;
}

// The last `period` accesses are the step; the next access begins the next one.
void PlannedPolicy::install_detected_plan(std::size_t period) {
  const std::size_t end = recording_.size();
  const std::size_t begin = end - period;
  std::vector<Access> sequence(recording_.begin() + static_cast<std::ptrdiff_t>(begin),
                               recording_.end());
  std::vector<Spill> spills;
  for (const Spill& spill : recorded_spills_) {
    if (spill.position >= begin && spill.position < end)
      spills.push_back({spill.position - begin, spill.chunks});
  }
  // The step's length: from the copy before it to this one.
  const std::uint64_t previous_ns = recording_[begin - period].time_ns;
  const std::uint64_t this_ns = recording_[begin].time_ns;
  install_plan(std::move(sequence), std::move(spills),
               this_ns > previous_ns ? this_ns - previous_ns : 0);
  position_ = sequence_.size();
  ref_traced_ns_ = sequence_.back().time_ns;
  state_.detected_period = static_cast<std::int64_t>(period);
}

void PlannedPolicy::start_marked_steps() {
  steps_marked_ = true;
  detector_ = PeriodDetector();  // its memory too
  // Whatever detection planned was provisional: plans and counts start from
  // the program's marks.
  shelved_.clear();
  shelved_accesses_ = 0;
  if (phase_ != Phase::tracing) {
    sequence_.clear();
    uses_.clear();
    spills_.clear();
    position_ = 0;
    behind_cache_.reset();
    step_ns_ = 0;
    phase_ = Phase::tracing;
  }
  state_ = {};
  traced_steps_ = 0;
  // The stream since the start is the first step, unless it was cut.
  recording_overflowed_ = history_trimmed_;
}

void PlannedPolicy::on_resident(ChunkId chunk) {
  lru_.on_resident(chunk);
  behind_cache_.reset();
}

void PlannedPolicy::on_spill(std::size_t chunks) {
  if (chunks == 0) return;
  const auto add = [&](std::vector<Spill>& spills, std::size_t position) {
    if (!spills.empty() && spills.back().position == position) {
      spills.back().chunks += chunks;
    } else {
      spills.push_back({position, chunks});
    }
  };
  // While following, the step's own, in case it departs (Note [Steps of
  // several kinds]).
  if (steps_marked_ && phase_ == Phase::following) add(step_spills_, position_);
  // Before the first mark every phase records (Note [Steps found in the access stream]).
  if (steps_marked_ && (phase_ != Phase::tracing || recording_overflowed_)) return;
  add(recorded_spills_, recording_.size());
}

// Note [Write-backs ahead of spills].
std::vector<ChunkId> PlannedPolicy::spill_victims_ahead(
    const EvictionCandidates& candidates) const {
  if (phase_ != Phase::following || spills_.empty()) return {};
  const std::size_t size = sequence_.size();
  // The next spill: at or after the current position, or the next step's first.
  const auto next = std::ranges::lower_bound(spills_, position_, {}, &Spill::position);
  const Spill spill = next != spills_.end()
                          ? *next
                          : Spill{spills_.front().position + size, spills_.front().chunks};
  if (spill.position - position_ > kWriteBackLookahead) return {};  // bounds the work per access
  // Belady's victims at the spill, among every resident chunk (one in use now
  // may be idle by then)...
  std::vector<Victim> ranked;
  for (const ChunkId chunk : lru_.recency())
    ranked.push_back({chunk, distance_from(spill.position, chunk)});
  // ... farthest next use first; stable, so ties keep LRU's order, as choose_victim's do.
  std::ranges::stable_sort(ranked, std::ranges::greater{}, &Victim::next_use);
  ranked.resize(std::min(spill.chunks + kSpareSpillVictims, ranked.size()));
  // ... those that may be written back now and stay clean until the spill;
  // the spares only once the spill's own may, so that a spare's write-back
  // never holds up theirs (one at a time on the write-back stream).
  std::vector<ChunkId> victims;
  for (std::size_t rank = 0; rank < ranked.size(); ++rank) {
    const ChunkId chunk = ranked[rank].chunk;
    if (candidates.evictable(chunk) && !written_between(chunk, position_, spill.position)) {
      victims.push_back(chunk);
    } else if (rank < spill.chunks) {
      break;
    }
  }
  return victims;
}

void PlannedPolicy::on_evicted(ChunkId chunk) {
  lru_.on_evicted(chunk);
  resident_from_ = resident_until_ = 0;
  behind_cache_.reset();
}

// A removed chunk may still be in the plan; if the step uses it, the access
// sequence departs from the plan there and the plan is dropped.
void PlannedPolicy::on_removed(ChunkId chunk) {
  lru_.on_removed(chunk);
  resident_from_ = resident_until_ = 0;
  behind_cache_.reset();
}

std::optional<ChunkId> PlannedPolicy::choose_victim(const EvictionCandidates& candidates) {
  if (phase_ != Phase::following) return lru_.choose_victim(candidates);
  const std::optional<Victim> victim = farthest_next_use(position_, &candidates);
  if (!victim) return std::nullopt;
  return victim->chunk;
}

std::optional<ChunkId> PlannedPolicy::prefetch_candidate() const {
  const std::optional<Candidate> next = next_prefetch(kPrefetchLookahead);
  if (!next) return std::nullopt;
  return next->chunk;
}

// Note [Prefetch timed by op durations] (prefetch_timing.h).
std::optional<PlannedFetch> PlannedPolicy::timed_prefetch(const CopyClock& clock) const {
  // Note [Room a prefetch takes early]: a timed fetch looks a whole step ahead.
  const bool timed_fetches = timed() && clock.copies_modelled();
  const std::optional<Candidate> next =
      next_prefetch(timed_fetches ? sequence_.size() : kPrefetchLookahead);
  if (!next) return std::nullopt;
  if (!timed_fetches) return PlannedFetch{next->chunk};
  const std::optional<std::uint64_t> copy_ns = clock.fetch_ns(next->chunk);
  if (!copy_ns) return PlannedFetch{next->chunk};
  const std::uint64_t now_ns = clock.now_ns();
  // The next point to start it at: the first coming access predicted after
  // now (accesses of the same op come at once); none before the use: now.
  std::uint64_t next_decision_ns = now_ns;
  for (std::size_t ahead = 0; ahead < next->ahead; ++ahead) {
    const std::uint64_t at = predicted_ns(position_ + ahead);
    if (at > now_ns) {
      next_decision_ns = at;
      break;
    }
  }
  const std::uint64_t use_ns = predicted_ns(position_ + next->ahead);
  // It arrives before its use, and before the fetches behind it must start.
  std::uint64_t arrive_by = use_ns;
  if (clock.queues_on_fetch_stream(next->chunk)) {
    const std::size_t use = position_ + next->ahead;
    if (!behind_cache_ || behind_cache_->chunk != next->chunk || behind_cache_->use != use) {
      // Both from the same reference access, so the lead stays right while
      // the position moves and nothing arrives or leaves.
      const std::uint64_t latest = latest_start_behind(fetches_behind(*next, *copy_ns, clock));
      behind_cache_ = BehindCache{next->chunk, use, use_ns > latest ? use_ns - latest : 0};
    }
    arrive_by = use_ns - std::min(use_ns, behind_cache_->lead_ns);
  }
  FetchTiming timing{.now_ns = now_ns,
                     .next_decision_ns = next_decision_ns,
                     .use_ns = arrive_by,
                     .stream_free_at_ns = clock.stream_free_at_ns(next->chunk),
                     .copy_ns = *copy_ns};
  if (!must_start_now(timing)) return std::nullopt;
  timing.use_ns = use_ns;  // the stall it expects is at its own use
  // Note [Room a prefetch takes early].
  const std::size_t victims = clock.fits_without_eviction(next->chunk) ? 1 : 2;
  if (crowded_before(next->ahead, clock.non_model_bytes(), clock.room_bytes(next->chunk)) &&
      !victims_at_use(next->ahead, victims)) {
    return std::nullopt;
  }
  return PlannedFetch{next->chunk, expected_stall_ns(timing)};
}

bool PlannedPolicy::victims_at_use(std::size_t ahead, std::size_t wanted) const {
  // Belady's `wanted` choices at the use: the resident chunks next used
  // farthest from there, least recent first among ties.
  const std::size_t use = position_ + ahead;
  std::vector<Victim> farthest;
  for (const ChunkId chunk : lru_.recency()) {
    const Victim victim{chunk, distance_from(use, chunk)};
    const auto at = std::ranges::find_if(
        farthest, [&](const Victim& other) { return victim.next_use > other.next_use; });
    farthest.insert(at, victim);
    if (farthest.size() > wanted) farthest.pop_back();
  }
  if (farthest.size() < wanted) return false;
  return std::ranges::all_of(
      farthest, [&](const Victim& victim) { return distance_to_next_use(victim.chunk) > ahead; });
}

bool PlannedPolicy::crowded_before(std::size_t ahead, std::uint64_t now, std::uint64_t room) const {
  const std::size_t size = sequence_.size();
  const std::size_t begin = position_ % size;
  const std::uint64_t threshold = now > std::numeric_limits<std::uint64_t>::max() - room
                                      ? std::numeric_limits<std::uint64_t>::max()
                                      : now + room;
  // Up to the use's access itself (its high water is the rise just before
  // it); the use's op allocates once the chunk is in use, and cannot evict it.
  // The window [begin, begin + ahead] runs into the next repetition at most once.
  const std::size_t end = begin + ahead + 1;
  if (end > size && high_waters_.last_above(0, end - size, threshold)) return true;
  return high_waters_.last_above(begin, std::min(end, size), threshold).has_value();
}

std::uint64_t PlannedPolicy::predicted_ns(std::size_t index) const {
  const std::size_t size = sequence_.size();
  const std::uint64_t traced = sequence_[index % size].time_ns + (index / size) * step_ns_;
  if (traced <= ref_traced_ns_) return ref_real_ns_;
  return ref_real_ns_ + (traced - ref_traced_ns_);
}

// Note [Planned prefetch].
std::optional<PlannedPolicy::Candidate> PlannedPolicy::next_prefetch(std::size_t lookahead) const {
  if (phase_ != Phase::following || sequence_.empty()) return std::nullopt;
  const std::size_t size = sequence_.size();
  lookahead = std::min(lookahead, size);
  if (resident_from_ > position_ || resident_until_ < position_)
    resident_from_ = resident_until_ = position_;
  // A chunk used on the host first would lose a device copy fetched now
  // (acquire_host drops it or writes around it), so it is skipped.
  std::vector<ChunkId> used_on_host_first;
  bool all_resident_so_far = true;
  for (std::size_t ahead = resident_until_ - position_; ahead < lookahead; ++ahead) {
    const Access& access = sequence_[(position_ + ahead) % size];
    const ChunkId chunk = access.chunk;
    if (access.on_host) {
      used_on_host_first.push_back(chunk);
      all_resident_so_far = false;
      continue;
    }
    if (lru_.resident(chunk)) {
      if (all_resident_so_far) resident_until_ = position_ + ahead + 1;
      continue;
    }
    all_resident_so_far = false;
    if (std::ranges::find(used_on_host_first, chunk) != used_on_host_first.end()) continue;
    return Candidate{chunk, ahead};
  }
  return std::nullopt;
}

std::vector<QueuedFetch> PlannedPolicy::fetches_behind(const Candidate& first,
                                                       std::uint64_t first_copy_ns,
                                                       const CopyClock& clock) const {
  const std::size_t size = sequence_.size();
  // A fetch used later than kFetchesBehind copies after the first's use
  // cannot hurry it (copies of one size; the scan stops there).
  const std::uint64_t first_use_ns = predicted_ns(position_ + first.ahead);
  const std::uint64_t window_ns = kFetchesBehind * margined_copy_ns(first_copy_ns);
  const std::uint64_t horizon_ns =
      first_use_ns > std::numeric_limits<std::uint64_t>::max() - window_ns
          ? std::numeric_limits<std::uint64_t>::max()
          : first_use_ns + window_ns;
  std::vector<QueuedFetch> behind;
  std::vector<ChunkId> counted{first.chunk};  // or used on the host first: never prefetched
  for (std::size_t ahead = first.ahead + 1; ahead < size && behind.size() < kFetchesBehind;
       ++ahead) {
    const std::uint64_t use_ns = predicted_ns(position_ + ahead);
    if (use_ns > horizon_ns) break;
    const Access& access = sequence_[(position_ + ahead) % size];
    if (!access.on_host && lru_.resident(access.chunk)) continue;
    if (std::ranges::find(counted, access.chunk) != counted.end()) continue;
    counted.push_back(access.chunk);
    if (access.on_host || !clock.queues_on_fetch_stream(access.chunk)) continue;
    const std::optional<std::uint64_t> copy_ns = clock.fetch_ns(access.chunk);
    if (copy_ns) behind.push_back({use_ns, *copy_ns});
  }
  return behind;
}

// Note [Planned prefetch]: the victim is the one Belady would evict when the
// incoming chunk is used, and it may leave now only if nothing uses it before.
std::optional<ChunkId> PlannedPolicy::choose_victim_for_prefetch(
    const EvictionCandidates& candidates, ChunkId incoming) {
  if (phase_ != Phase::following) return std::nullopt;
  const std::size_t until_use = distance_to_next_use(incoming);
  if (until_use == std::numeric_limits<std::size_t>::max()) return std::nullopt;
  const std::size_t use = position_ + until_use;  // may run into the next repetition
  // Among every resident chunk, in use or not: Belady's choice at the use.
  const std::optional<Victim> victim = farthest_next_use(use, nullptr);
  if (!victim || !candidates.evictable(victim->chunk)) return std::nullopt;
  if (distance_to_next_use(victim->chunk) < until_use) return std::nullopt;  // used before
  return victim->chunk;
}

std::optional<PlannedPolicy::Victim> PlannedPolicy::farthest_next_use(
    std::size_t from, const EvictionCandidates* candidates) const {
  std::optional<Victim> victim;
  for (const ChunkId chunk : lru_.recency()) {  // least recent first: ties go to it
    if (candidates != nullptr && !candidates->evictable(chunk)) continue;
    const std::size_t distance = distance_from(from, chunk);
    if (!victim || distance > victim->next_use) victim = Victim{chunk, distance};
    if (victim->next_use == std::numeric_limits<std::size_t>::max()) break;  // never used again
  }
  return victim;
}

void PlannedPolicy::on_step_end() {
  if (!steps_marked_) start_marked_steps();
  std::vector<Spill> step_spills = std::move(step_spills_);
  step_spills_.clear();
  switch (phase_) {
    case Phase::tracing:
      ++traced_steps_;
      if (traced_steps_ >= warmup_steps_ && !recording_overflowed_ && !recording_.empty()) {
        build_plan();
      } else {
        recording_.clear();
        recorded_spills_.clear();
      }
      recording_overflowed_ = false;
      break;
    case Phase::following:
      if (position_ == 0) break;  // a step without accesses
      if (position_ < sequence_.size()) {
        // Ended early (Note [Steps of several kinds]): another kind of step,
        // whose trace is what it did of the plan.
        const std::vector<Access> prefix(
            sequence_.begin(), sequence_.begin() + static_cast<std::ptrdiff_t>(position_));
        if (!switch_plan(prefix, std::nullopt)) {
          ++state_.divergences;
          step_spills_ = std::move(step_spills);
          trace_from_here(std::nullopt);
          build_plan();
          break;
        }
      }
      ++state_.planned_steps;
      // Note [Write-backs ahead of spills]: the next step spills where this one did.
      if (!step_spills.empty()) spills_ = std::move(step_spills);
      position_ = 0;
      behind_cache_.reset();
      ref_traced_ns_ = 0;  // the step's end is the next one's start
      ref_real_ns_ = now_ns_;
      break;
    case Phase::diverged:
      // The next step is traced again, and planned from.
      phase_ = Phase::tracing;
      traced_steps_ = warmup_steps_ - 1;
      recording_.clear();
      recorded_spills_.clear();
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
  std::vector<Access> sequence = std::move(recording_);
  recording_.clear();
  std::vector<Spill> spills = std::move(recorded_spills_);
  recorded_spills_.clear();
  const std::uint64_t first_ns = sequence.front().time_ns;
  install_plan(std::move(sequence), std::move(spills), now_ns_ > first_ns ? now_ns_ - first_ns : 0);
  position_ = 0;
  behind_cache_.reset();
  ref_traced_ns_ = 0;
}

void PlannedPolicy::install_plan(std::vector<Access> sequence, std::vector<Spill> spills,
                                 std::uint64_t step_ns) {
  sequence_ = std::move(sequence);
  spills_ = std::move(spills);
  // Note [Prefetch timed by op durations]: times from the step's first access;
  // a clock that did not move leaves the plan untimed.
  const std::uint64_t first_ns = sequence_.front().time_ns;
  for (Access& access : sequence_)  // threads' stalls overlapping may step the clock back
    access.time_ns = access.time_ns > first_ns ? access.time_ns - first_ns : 0;
  step_ns_ = step_ns;
  ref_real_ns_ = now_ns_;
  uses_.clear();
  for (std::size_t i = 0; i < sequence_.size(); ++i) uses_[sequence_[i].chunk].push_back(i);
  std::vector<std::uint64_t> high_waters;
  high_waters.reserve(sequence_.size());
  for (const Access& access : sequence_) high_waters.push_back(access.non_model_high_water);
  high_waters_ = RangeMax(high_waters);
  resident_from_ = resident_until_ = 0;
  behind_cache_.reset();
  phase_ = Phase::following;
  ++state_.plans_built;
}

void PlannedPolicy::diverge() {
  phase_ = Phase::diverged;
  ++state_.divergences;
  sequence_.clear();
  uses_.clear();
  spills_.clear();
  position_ = 0;
  behind_cache_.reset();
  step_ns_ = 0;
  state_.detected_period = 0;
}

std::size_t PlannedPolicy::distance_to_next_use(ChunkId chunk) const {
  return distance_from(position_, chunk);
}

std::size_t PlannedPolicy::distance_from(std::size_t from, ChunkId chunk) const {
  const auto found = uses_.find(chunk);
  if (found == uses_.end()) return std::numeric_limits<std::size_t>::max();
  const std::vector<std::size_t>& positions = found->second;
  const std::size_t size = sequence_.size();
  const std::size_t in_step = from % size;  // `from` may lie in the next repetition
  const auto next = std::lower_bound(positions.begin(), positions.end(), in_step);
  if (next != positions.end()) return *next - in_step;
  return size - in_step + positions.front();  // in the next repetition
}

bool PlannedPolicy::written_between(ChunkId chunk, std::size_t from, std::size_t to) const {
  const auto found = uses_.find(chunk);
  if (found == uses_.end()) return false;
  const std::size_t size = sequence_.size();
  for (std::size_t at = from; at < to;) {
    const std::vector<std::size_t>& positions = found->second;
    const auto use = std::lower_bound(positions.begin(), positions.end(), at % size);
    if (use == positions.end()) {  // none left in this repetition
      at += size - at % size;
      continue;
    }
    const std::size_t absolute = at - at % size + *use;
    if (absolute >= to) return false;
    if (sequence_[*use].writes) return true;
    at = absolute + 1;
  }
  return false;
}

}  // namespace spillway
