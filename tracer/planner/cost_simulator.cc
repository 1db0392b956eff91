// Cost simulator: a timeline of three streams (compute, h2d, d2h) driven by
// per-op evict/fetch lists, which come from the planner (planned, belady)
// or are decided online (lru). See cost_simulator.h for the model.
#include "tracer/planner/cost_simulator.h"

#include <algorithm>
#include <cstddef>
#include <list>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tracer/planner/headroom.h"
#include "tracer/planner/planner.h"

namespace spillway::plan {
namespace {

class Timeline {
 public:
  Timeline(const CostModel& model, std::vector<std::size_t> capacity)
      : model_(model), capacity_(std::move(capacity)) {}

  void begin_step() {
    cost_ = {};
    step_begin_ = compute_end_;
  }

  // Runs op `index` of the step: issues its planned copies, waits for its
  // chunks and for its room, computes.
  void run_op(std::size_t index, const TracedOp& op, const OpPlan& copies) {
    const double issue = compute_end_;
    // The k-th fetch fills the room of the k-th eviction: it waits for that
    // chunk's write-back only, so the two copy streams pipeline.
    for (PlanChunk chunk : copies.write_back) {
      const double start = std::max(issue, d2h_free_);
      d2h_free_ = start + model_.d2h_ns(model_.chunk_size);
      written_back_[chunk] = d2h_free_;
      cost_.d2h_bytes += model_.chunk_size;
    }
    std::vector<double> room_free;
    for (const PlannedEviction& eviction : copies.evict) {
      if (!eviction.dirty) {
        auto written = written_back_.find(eviction.chunk);
        room_free.push_back(written == written_back_.end() ? issue
                                                           : std::max(issue, written->second));
        continue;
      }
      const double start = std::max(issue, d2h_free_);
      d2h_free_ = start + model_.d2h_ns(model_.chunk_size);
      room_free.push_back(d2h_free_);
      cost_.d2h_bytes += model_.chunk_size;
    }
    std::sort(room_free.begin(), room_free.end());
    for (std::size_t k = 0; k < copies.fetch.size(); ++k) {
      const PlannedFetch& fetch = copies.fetch[k];
      const double room = k < room_free.size() ? room_free[k] : issue;
      if (fetch.zero_fill) {
        arrival_[fetch.chunk] = std::max(issue, room);  // no link, no FIFO (planner.h)
        continue;
      }
      const double start = std::max({issue, h2d_free_, room});
      h2d_free_ = start + model_.h2d_ns(model_.chunk_size);
      arrival_[fetch.chunk] = h2d_free_;
      cost_.h2d_bytes += model_.chunk_size;
    }
    for (std::size_t k = copies.fetch.size(); k < room_free.size(); ++k) {
      vacating_.push_back(room_free[k]);
    }
    resident_ += static_cast<std::ptrdiff_t>(copies.fetch.size()) -
                 static_cast<std::ptrdiff_t>(copies.evict.size());
    double start = compute_end_;
    for (const ChunkUse& use : op.chunks) {
      if (auto it = arrival_.find(use.chunk); it != arrival_.end()) {
        start = std::max(start, it->second);
      }
    }
    cost_.stall_ns += start - compute_end_;
    const double roomy = wait_for_room(index, op, start);
    cost_.spill_wait_ns += roomy - start;
    compute_end_ = roomy + static_cast<double>(op.duration_ns);
  }

  StepCost end_step() {
    cost_.step_ns = compute_end_ - step_begin_;
    return cost_;
  }

 private:
  // Note [An op waits for the room it takes]
  // An eviction that no fetch fills makes room for the op's own non-model
  // bytes (its capacity is lower than the op before's), or, where the
  // planner fetched early into room to spare, gives that room back. Until a
  // dirty victim's write-back ends, its bytes still hold the room, so the op
  // starts only once the resident chunks and those still leaving fit its
  // capacity: the allocator's wait for a spill (chunk-manager.md) at run
  // time. Without this the simulator let such an op run on room that was
  // not yet there.
  double wait_for_room(std::size_t index, const TracedOp& op, double start) {
    const auto capacity = static_cast<std::ptrdiff_t>(capacity_[index]);
    // A plan never holds more chunks than an op's capacity; one that does
    // is the planner's error, not a wait.
    if (resident_ > capacity) {
      throw PlanError("cost simulator: op " + std::to_string(index) + " (" + op.name + ") runs " +
                      "with " + std::to_string(resident_) + " chunks planned resident, " +
                      std::to_string(capacity) + " fit");
    }
    std::sort(vacating_.begin(), vacating_.end());
    std::erase_if(vacating_, [start](double free) { return free <= start; });
    const std::ptrdiff_t excess =
        resident_ + static_cast<std::ptrdiff_t>(vacating_.size()) - capacity;
    if (excess <= 0) return start;
    const double roomy = vacating_[static_cast<std::size_t>(excess - 1)];
    std::erase_if(vacating_, [roomy](double free) { return free <= roomy; });
    return roomy;
  }

  const CostModel& model_;
  const std::vector<std::size_t> capacity_;  // chunks that fit beside each op
  double compute_end_ = 0;
  double h2d_free_ = 0;
  double d2h_free_ = 0;
  double step_begin_ = 0;
  std::ptrdiff_t resident_ = 0;   // chunks resident or arriving, by the plans run so far
  std::vector<double> vacating_;  // when the room of each unfilled eviction frees
  std::unordered_map<PlanChunk, double> arrival_;
  std::unordered_map<PlanChunk, double> written_back_;  // when its write-back ends
  StepCost cost_;
};

// Online LRU: demand fetch; victims are the least recently used chunks the
// op does not need. Dead bytes (planner.h) are the bridge's doing, not the
// policy's, so LRU has them too.
class LruResidency {
 public:
  explicit LruResidency(const StepTrace& trace) : dead_(dead_after(trace)) {}

  OpPlan before(const TracedOp& op, std::size_t capacity) {
    std::set<PlanChunk> needed;
    for (const ChunkUse& use : op.chunks) needed.insert(use.chunk);
    OpPlan copies;
    std::vector<PlanChunk> missing;
    for (PlanChunk chunk : needed) {
      if (!position_.contains(chunk)) missing.push_back(chunk);
    }
    for (auto it = recency_.begin();
         position_.size() + missing.size() > capacity && it != recency_.end();) {
      if (needed.contains(*it)) {
        ++it;
        continue;
      }
      copies.evict.push_back({*it, dirty_[*it]});
      dirty_.erase(*it);
      position_.erase(*it);
      it = recency_.erase(it);
    }
    for (PlanChunk chunk : missing) {
      copies.fetch.push_back({chunk, 0, fresh_use(op, chunk)});
      position_[chunk] = recency_.insert(recency_.end(), chunk);
      dirty_[chunk] = false;
    }
    for (const ChunkUse& use : op.chunks) {
      recency_.splice(recency_.end(), recency_, position_[use.chunk]);
      if (use.write) dirty_[use.chunk] = true;
    }
    return copies;
  }

  // Op `index` ran: the chunks whose bytes die after it are clean.
  void after(std::size_t index) {
    for (PlanChunk chunk : dead_[index]) {
      if (auto it = dirty_.find(chunk); it != dirty_.end()) it->second = false;
    }
  }

  Residency residency() const { return Residency(dirty_.begin(), dirty_.end()); }

 private:
  std::list<PlanChunk> recency_;
  std::map<PlanChunk, std::list<PlanChunk>::iterator> position_;
  std::map<PlanChunk, bool> dirty_;
  std::vector<std::vector<PlanChunk>> dead_;
};

std::set<PlanChunk> all_chunks(const StepTrace& trace) {
  std::set<PlanChunk> chunks;
  for (const TracedOp& op : trace.ops) {
    for (const ChunkUse& use : op.chunks) chunks.insert(use.chunk);
  }
  return chunks;
}

void run_lru(const StepTrace& trace, const std::vector<std::size_t>& capacity, Timeline& timeline,
             LruResidency& lru, SimResult& result) {
  timeline.begin_step();
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    timeline.run_op(i, trace.ops[i], lru.before(trace.ops[i], capacity[i]));
    lru.after(i);
  }
  result.steps.push_back(timeline.end_step());
}

void run_plan(const StepTrace& trace, const Plan& plan, Timeline& timeline, SimResult& result) {
  timeline.begin_step();
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    timeline.run_op(i, trace.ops[i], plan.ops[i]);
  }
  result.steps.push_back(timeline.end_step());
}

// Note [A bound that knows room]
// max(compute, bytes / bandwidth) assumes the copies can spread over the
// whole step. Where room is short they cannot: the optimizer's phase of a
// step that spills touches every chunk while the optimizer's state leaves
// room for few, so its copies cannot run during the forward's compute. A
// stretch of ops [a, b) lasts at least its compute, and at least the copy
// time of the chunks it uses beyond what can be on the device at op a:
// at most capacity[a] chunks are resident or arriving then (a fetch in
// flight holds its room), so the others are fetched after op a begins and
// arrive before their use, one at a time on the host-to-device stream. A
// chunk whose first use in the stretch is fresh comes in with no copy.
// The other direction likewise: of the chunks ops a to b-2 write whose
// bytes are still live when op b-1 starts, at most capacity[b-1] are on
// the device then (resident, or leaving with their write-back still
// holding the room: Note [An op waits for the room it takes]); each of the
// others was written back after op a began and before op b-1 started, one
// at a time on the device-to-host stream.
// The copies into a stretch also wait for room (Note [The first copy into a
// full stretch]).
// Every cut of the step into stretches gives a lower bound, the sum of
// each stretch's largest term; this is the largest, by dynamic programming
// over the cut points. Stretches are at most kLongestStretch ops: a
// bound over fewer cuts is still a bound, and it keeps a long trace's
// bound from costing ops^2.
//
// Note [The first copy into a full stretch]
// Of a stretch's N copied chunks (first use there not fresh), at most
// c = capacity[a] are on the device or arriving at op a, so at least N - c
// are fetched after it, one after another. Either at least N - c + 1 are
// (a slot was free at a, or a chunk left before its last use and came
// back), which takes (N - c + 1) copies; or exactly N - c are, and then the
// c slots all hold copied chunks of the stretch, so the first fetch starts
// only once a slot frees: one of them leaves for free (after its last use
// in the stretch, or after the use its bytes die after, since a dead chunk
// leaves without a write-back and comes back zeroed), or the capacity rises.
// The last fetch then arrives N - c copies after that, and the op that uses
// it (at the latest, the stretch's last first use of a copied chunk) and
// those after it still run. So the stretch lasts at least (N - c) copies
// plus the smaller of one copy and that wait plus that tail. On the demo's
// GPT at 42 MiB (bench_train) this raised the bound of a traced step from
// 59.9 to 62.6 ms: the optimizer's stretch, whose first slot frees only
// once the optimizer is done with a chunk.
constexpr std::size_t kLongestStretch = 4096;

double room_bound_ns(const StepTrace& trace, const CostModel& model) {
  const std::size_t n = trace.ops.size();
  const std::vector<std::size_t> capacity = chunk_capacity(trace, model);
  const std::vector<std::vector<PlanChunk>> dead = dead_after(trace);
  // Dense chunk indices; each op's uses as (index, fresh), its writes, and
  // the chunks whose bytes die after it.
  std::unordered_map<PlanChunk, std::uint32_t> index;
  std::vector<std::vector<std::pair<std::uint32_t, bool>>> uses(n);
  std::vector<std::vector<std::uint32_t>> writes(n);
  std::vector<std::vector<std::uint32_t>> dies(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (const ChunkUse& use : trace.ops[i].chunks) {
      const auto [it, added] = index.try_emplace(use.chunk, index.size());
      uses[i].emplace_back(it->second, fresh_use(trace.ops[i], use.chunk));
      if (use.write) writes[i].push_back(it->second);
    }
    for (PlanChunk chunk : dead[i]) dies[i].push_back(index.at(chunk));  // op i used it
  }
  const double h2d_ns = model.h2d_ns(model.chunk_size);
  const double d2h_ns = model.d2h_ns(model.chunk_size);
  const auto beyond = [](std::size_t count, std::size_t room) {
    return static_cast<double>(count > room ? count - room : 0);
  };
  // Compute before op i, and the first op after a with more room than a.
  std::vector<double> compute_before(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    compute_before[i + 1] = compute_before[i] + static_cast<double>(trace.ops[i].duration_ns);
  }
  std::vector<std::size_t> room_rises(n, n);
  std::vector<std::size_t> rising;  // ops whose rise is not found yet, capacity non-increasing
  for (std::size_t i = 0; i < n; ++i) {
    while (!rising.empty() && capacity[rising.back()] < capacity[i]) {
      room_rises[rising.back()] = i;
      rising.pop_back();
    }
    rising.push_back(i);
  }
  std::vector<double> best(n + 1, 0.0);            // the best bound of ops [0, b)
  std::vector<std::size_t> seen(index.size(), n);  // the stretch that saw a chunk last
  std::vector<std::size_t> live(index.size(), n);  // the stretch a chunk's live write is in
  // Note [The first copy into a full stretch]: for the copied chunks of the
  // stretch, the op after which each may leave for free; `leaves` holds
  // (op, chunk) in order of op, an entry stale once the chunk's op moved on.
  std::vector<std::size_t> copied_in(index.size(), n);  // the stretch it is copied into
  std::vector<std::size_t> died_in(index.size(), n);    // the stretch its bytes died in
  std::vector<std::size_t> free_after(index.size(), 0);
  std::vector<std::pair<std::size_t, std::uint32_t>> leaves;
  for (std::size_t a = 0; a < n; ++a) {
    std::size_t copied = 0;           // chunks of [a, b) whose first use there is not fresh
    std::size_t written = 0;          // chunks ops [a, b-1) wrote, live when op b-1 starts
    std::size_t last_first_copy = a;  // the latest first use of a copied chunk
    leaves.clear();
    std::size_t leaves_front = 0;
    for (std::size_t b = a + 1; b <= std::min(n, a + kLongestStretch); ++b) {
      const std::size_t op = b - 1;
      if (op > a) {  // op - 1's writes and deaths happened before op starts
        for (std::uint32_t chunk : writes[op - 1]) {
          if (live[chunk] != a) ++written;
          live[chunk] = a;
        }
        for (std::uint32_t chunk : dies[op - 1]) {
          if (live[chunk] == a) --written;
          live[chunk] = n;
          died_in[chunk] = a;
        }
      }
      for (const auto& [chunk, fresh] : uses[op]) {
        if (seen[chunk] != a) {
          seen[chunk] = a;
          if (fresh) continue;
          copied_in[chunk] = a;
          ++copied;
          last_first_copy = op;
        } else if (copied_in[chunk] != a || died_in[chunk] == a) {
          continue;  // not copied, or free to leave where its bytes died
        }
        free_after[chunk] = op;
        leaves.emplace_back(op, chunk);
      }
      double copies = beyond(copied, capacity[a]) * h2d_ns;
      if (copies > 0) {
        while (free_after[leaves[leaves_front].second] != leaves[leaves_front].first) {
          ++leaves_front;  // stale: that chunk is used later
        }
        const std::size_t slot_frees = std::min({leaves[leaves_front].first + 1, room_rises[a], b});
        const double wait = compute_before[slot_frees] - compute_before[a];
        const double tail = compute_before[b] - compute_before[last_first_copy];
        copies += std::min(h2d_ns, wait + tail);
      }
      const double stretch = std::max(
          {compute_before[b] - compute_before[a], copies, beyond(written, capacity[op]) * d2h_ns});
      best[b] = std::max(best[b], best[a] + stretch);
    }
  }
  return best[n];
}

}  // namespace

std::string_view policy_name(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::planned:
      return "planned";
    case SimPolicy::lru:
      return "lru";
    case SimPolicy::static_residency:
      return "static";
    case SimPolicy::belady:
      return "belady";
  }
  return "?";
}

StepCost SimResult::total() const { return total(0, steps.size()); }

StepCost SimResult::total(std::size_t first, std::size_t end) const {
  StepCost sum;
  for (std::size_t s = first; s < std::min(end, steps.size()); ++s) {
    const StepCost& step = steps[s];
    sum.h2d_bytes += step.h2d_bytes;
    sum.d2h_bytes += step.d2h_bytes;
    sum.stall_ns += step.stall_ns;
    sum.spill_wait_ns += step.spill_wait_ns;
    sum.step_ns += step.step_ns;
  }
  return sum;
}

SimResult simulate(const StepTrace& trace, const CostModel& model, SimPolicy policy,
                   std::size_t steps, PlanOptions plan_options) {
  SimResult result;
  result.policy = policy;
  try {
    const std::vector<std::size_t> capacity = chunk_capacity(trace, model);
    Timeline timeline(model, capacity);
    switch (policy) {
      case SimPolicy::static_residency: {
        std::uint64_t peak_non_model = 0;
        for (const TracedOp& op : trace.ops) {
          peak_non_model = std::max(peak_non_model, op.non_model_bytes);
        }
        const std::uint64_t model_bytes = all_chunks(trace).size() * model.chunk_size;
        if (model_bytes + peak_non_model + model.margin_bytes > model.device_budget) {
          result.error = "static: " + std::to_string(model_bytes) + " bytes of chunks + " +
                         std::to_string(peak_non_model) + " peak non-model bytes + " +
                         std::to_string(model.margin_bytes) + " margin exceed the budget of " +
                         std::to_string(model.device_budget) + " bytes";
          return result;
        }
        const Plan nothing{std::vector<OpPlan>(trace.ops.size())};
        for (std::size_t s = 0; s < steps; ++s) run_plan(trace, nothing, timeline, result);
        break;
      }
      case SimPolicy::lru: {
        LruResidency lru(trace);
        for (std::size_t s = 0; s < steps; ++s) run_lru(trace, capacity, timeline, lru, result);
        break;
      }
      case SimPolicy::planned: {
        if (plan_options.choose_headroom && steps > 1) {
          plan_options.headroom_reserve = choose_headroom_reserve(trace, model, plan_options);
        }
        LruResidency lru(trace);
        if (steps > 0) run_lru(trace, capacity, timeline, lru, result);
        // A plan depends only on the residency it starts from, and that
        // settles after a step or two, so plans are memoised by it.
        std::map<Residency, Plan> plans;
        Residency residency = lru.residency();
        for (std::size_t s = 1; s < steps; ++s) {
          auto found = plans.find(residency);
          if (found == plans.end()) {
            found =
                plans.emplace(residency, plan_step(trace, model, residency, plan_options)).first;
          }
          run_plan(trace, found->second, timeline, result);
          residency = found->second.end;
        }
        break;
      }
      case SimPolicy::belady: {
        StepTrace run;
        for (std::size_t s = 0; s < steps; ++s) {
          run.ops.insert(run.ops.end(), trace.ops.begin(), trace.ops.end());
        }
        const Plan plan =
            plan_step(run, model, Residency{}, PlanOptions{.cyclic = false, .prefetch_reserve = 0});
        const std::size_t n = trace.ops.size();
        for (std::size_t s = 0; s < steps; ++s) {
          timeline.begin_step();
          for (std::size_t i = 0; i < n; ++i) {
            timeline.run_op(i, trace.ops[i], plan.ops[s * n + i]);
          }
          result.steps.push_back(timeline.end_step());
        }
        break;
      }
    }
  } catch (const PlanError& error) {
    result.error = error.what();
  }
  return result;
}

StepBound step_bound(const StepTrace& trace, const CostModel& model) {
  StepBound bound;
  for (const TracedOp& op : trace.ops) bound.compute_ns += static_cast<double>(op.duration_ns);
  const Plan steady = plan_steady(trace, model, {.prefetch_reserve = 0});
  bound.h2d_bytes = steady.h2d_bytes;
  bound.d2h_bytes = steady.d2h_bytes;
  bound.flat_ns =
      std::max({bound.compute_ns, model.h2d_ns(bound.h2d_bytes), model.d2h_ns(bound.d2h_bytes)});
  bound.room_ns = room_bound_ns(trace, model);
  bound.bound_ns = std::max(bound.flat_ns, bound.room_ns);
  return bound;
}

}  // namespace spillway::plan
