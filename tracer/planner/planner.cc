// Planner: a Belady pass decides what is resident at every moment, then a
// prefetch pass moves each fetch (with its victim's eviction) as early as
// the constraints in planner.h allow. See planner.h for the why.
#include "tracer/planner/planner.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <string>

namespace spillway::plan {
namespace {

constexpr std::size_t kNever = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

std::string op_label(const TracedOp& op, std::size_t index) {
  return "op #" + std::to_string(index) + " '" + op.name + "'";
}

std::vector<PlanChunk> distinct_chunks(const TracedOp& op) {
  std::vector<PlanChunk> chunks;
  for (const ChunkUse& use : op.chunks) chunks.push_back(use.chunk);
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  return chunks;
}

// Where each chunk is used, so next use is a binary search.
class NextUse {
 public:
  NextUse(const StepTrace& trace, bool cyclic) : steps_(trace.ops.size()), cyclic_(cyclic) {
    for (std::size_t i = 0; i < trace.ops.size(); ++i) {
      for (PlanChunk chunk : distinct_chunks(trace.ops[i])) uses_[chunk].push_back(i);
    }
  }

  // The first use after op `after`, counting the next step's as steps_ + index.
  std::size_t after(PlanChunk chunk, std::size_t after) const {
    auto found = uses_.find(chunk);
    if (found == uses_.end()) return kNever;
    const std::vector<std::size_t>& uses = found->second;
    auto next = std::upper_bound(uses.begin(), uses.end(), after);
    if (next != uses.end()) return *next;
    return cyclic_ ? steps_ + uses.front() : kNever;
  }

 private:
  std::map<PlanChunk, std::vector<std::size_t>> uses_;
  std::size_t steps_;
  bool cyclic_;
};

// One fetch of the Belady pass, before prefetch moves it.
struct Miss {
  PlanChunk chunk = 0;
  std::size_t op = 0;
  bool zero_fill = false;  // its use is fresh
  bool has_victim = false;
  PlannedEviction victim;
  std::size_t victim_last_use = kNone;  // last op before `op` that used the victim
};

}  // namespace

bool fresh_use(const TracedOp& op, PlanChunk chunk) {
  for (const ChunkUse& use : op.chunks) {
    if (use.chunk == chunk) return use.fresh;  // the op's first use decides
  }
  return false;
}

std::vector<std::vector<PlanChunk>> dead_after(const StepTrace& trace) {
  const std::size_t n = trace.ops.size();
  std::vector<std::vector<PlanChunk>> dead(n);
  // Walking back twice over the step sees every use's next one, across the
  // step's end too.
  std::map<PlanChunk, bool> next_fresh;
  for (std::size_t k = 2 * n; k-- > 0;) {
    const TracedOp& op = trace.ops[k % n];
    for (PlanChunk chunk : distinct_chunks(op)) {
      if (k < n) {
        auto next = next_fresh.find(chunk);
        if (next != next_fresh.end() && next->second) dead[k].push_back(chunk);
      }
      next_fresh[chunk] = fresh_use(op, chunk);
    }
  }
  return dead;
}

std::uint64_t smallest_budget(const StepTrace& trace, const CostModel& model) {
  std::uint64_t smallest = 0;
  for (const TracedOp& op : trace.ops)
    smallest = std::max(smallest, distinct_chunks(op).size() * model.chunk_size +
                                      op.non_model_bytes + model.margin_bytes);
  return smallest;
}

std::vector<std::size_t> chunk_capacity(const StepTrace& trace, const CostModel& model) {
  if (model.chunk_size == 0) throw PlanError("planner: chunk_size is 0");
  std::vector<std::size_t> capacity;
  capacity.reserve(trace.ops.size());
  for (std::size_t i = 0; i < trace.ops.size(); ++i) {
    const TracedOp& op = trace.ops[i];
    const std::uint64_t chunk_bytes = distinct_chunks(op).size() * model.chunk_size;
    const std::uint64_t needed = chunk_bytes + op.non_model_bytes + model.margin_bytes;
    if (needed > model.device_budget) {
      throw PlanError(op_label(op, i) + " needs " + std::to_string(needed) + " bytes (" +
                      std::to_string(chunk_bytes) + " of chunks + " +
                      std::to_string(op.non_model_bytes) + " non-model + " +
                      std::to_string(model.margin_bytes) + " margin) but the device budget is " +
                      std::to_string(model.device_budget) + " bytes");
    }
    capacity.push_back((model.device_budget - op.non_model_bytes - model.margin_bytes) /
                       model.chunk_size);
  }
  return capacity;
}

Plan plan_step(const StepTrace& trace, const CostModel& model, const Residency& start,
               PlanOptions options) {
  const std::size_t n = trace.ops.size();
  const std::vector<std::size_t> capacity = chunk_capacity(trace, model);
  const NextUse next_use(trace, options.cyclic);
  const std::vector<std::vector<PlanChunk>> dead = dead_after(trace);
  const std::size_t reserve = options.prefetch_reserve;
  const std::size_t tightest =
      capacity.empty() ? 0 : *std::min_element(capacity.begin(), capacity.end());
  Plan plan;
  plan.ops.resize(n);
  plan.start = start;

  // Belady pass: what leaves and what arrives at each op, and the resident
  // count after each op's fetches.
  Residency resident = start;
  std::map<PlanChunk, std::size_t> last_use;                 // within this step
  std::map<PlanChunk, std::vector<std::size_t>> shrink_ops;  // unpaired evictions, by op
  std::vector<std::size_t> count(n, 0);
  std::vector<Miss> misses;
  std::vector<std::pair<std::size_t, PlannedEviction>> shrink_evictions;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<PlanChunk> needed = distinct_chunks(trace.ops[i]);
    std::vector<PlanChunk> missing;
    for (PlanChunk chunk : needed) {
      if (!resident.contains(chunk)) missing.push_back(chunk);
    }
    std::vector<PlannedEviction> victims;
    // Room kept free for prefetches: the reserve, plus headroom out of what
    // this moment has above the tightest one.
    const std::size_t headroom = std::min(options.headroom_reserve, capacity[i] - tightest);
    const std::size_t free_room = std::min(capacity[i], reserve + headroom);
    const std::size_t planned_capacity = std::max(needed.size(), capacity[i] - free_room);
    while (resident.size() + missing.size() > planned_capacity) {
      // Farthest next use leaves; on a tie a clean chunk, then the higher id.
      auto best = resident.end();
      std::size_t best_next = 0;
      for (auto it = resident.begin(); it != resident.end(); ++it) {
        if (std::binary_search(needed.begin(), needed.end(), it->first)) continue;
        const std::size_t next = next_use.after(it->first, i);
        if (best == resident.end() || next > best_next ||
            (next == best_next && best->second && !it->second)) {
          best = it;
          best_next = next;
        }
      }
      victims.push_back({best->first, best->second});
      resident.erase(best);
    }
    // Pair victims with fetches; a victim beyond the fetches is a shrink
    // (this op's non-model peak leaves fewer chunks) and stays at this op.
    for (std::size_t m = 0; m < missing.size(); ++m) {
      Miss miss{missing[m], i, fresh_use(trace.ops[i], missing[m])};
      if (m < victims.size()) {
        miss.has_victim = true;
        miss.victim = victims[m];
        auto used = last_use.find(victims[m].chunk);
        if (used != last_use.end()) miss.victim_last_use = used->second;
      }
      misses.push_back(miss);
      resident.emplace(missing[m], false);
    }
    for (std::size_t v = missing.size(); v < victims.size(); ++v) {
      shrink_evictions.emplace_back(i, victims[v]);
      shrink_ops[victims[v].chunk].push_back(i);
    }
    for (const ChunkUse& use : trace.ops[i].chunks) {
      if (use.write) resident[use.chunk] = true;
    }
    for (PlanChunk chunk : dead[i]) {
      if (auto it = resident.find(chunk); it != resident.end()) it->second = false;
    }
    for (PlanChunk chunk : needed) last_use[chunk] = i;
    count[i] = resident.size();
  }
  plan.end = resident;

  // Prefetch pass, in order of use (the copy stream is a FIFO).
  for (const auto& [op, eviction] : shrink_evictions) plan.ops[op].evict.push_back(eviction);
  std::size_t previous_issue = 0;
  std::map<PlanChunk, std::size_t> evicted_at;  // op of the chunk's latest eviction
  for (const Miss& miss : misses) {
    std::size_t fetch_op = miss.op;
    std::size_t evict_op = miss.op;
    // A zero fill has no copy to hide and no place in the fetch FIFO: it is
    // issued at its use, and later fetches do not queue behind it.
    if (options.prefetch && !miss.zero_fill) {
      std::size_t earliest = previous_issue;
      if (auto it = evicted_at.find(miss.chunk); it != evicted_at.end()) {
        earliest = std::max(earliest, it->second);
      }
      if (auto it = shrink_ops.find(miss.chunk); it != shrink_ops.end()) {
        for (std::size_t op : it->second) {
          if (op < miss.op) earliest = std::max(earliest, op);
        }
      }
      earliest = std::min(earliest, miss.op);
      // The victim leaves once its last use is over; the fetch may start
      // sooner where the moments in between have a chunk to spare (the
      // prefetch reserve keeps some).
      evict_op = earliest;
      if (miss.has_victim && miss.victim_last_use != kNone) {
        evict_op = std::min(std::max(evict_op, miss.victim_last_use + 1), miss.op);
      }
      if (!miss.has_victim) evict_op = miss.op;
      fetch_op = evict_op;
      while (fetch_op > earliest && count[fetch_op - 1] + 1 <= capacity[fetch_op - 1]) --fetch_op;
      for (std::size_t k = fetch_op; k < evict_op; ++k) ++count[k];
    }
    if (!miss.zero_fill) previous_issue = fetch_op;
    if (miss.has_victim) {
      plan.ops[evict_op].evict.push_back(miss.victim);
      evicted_at[miss.victim.chunk] = evict_op;
    }
    plan.ops[fetch_op].fetch.push_back({miss.chunk, miss.op, miss.zero_fill});
  }

  // Write-backs move to just after the chunk's last write before its
  // eviction (the step's start when it came dirty from the previous step).
  std::map<PlanChunk, std::vector<std::size_t>> writes;
  for (std::size_t i = 0; i < n; ++i) {
    for (const ChunkUse& use : trace.ops[i].chunks) {
      if (use.write && (writes[use.chunk].empty() || writes[use.chunk].back() != i)) {
        writes[use.chunk].push_back(i);
      }
    }
  }
  for (std::size_t j = 0; j < n; ++j) {
    for (PlannedEviction& eviction : plan.ops[j].evict) {
      if (!eviction.dirty) continue;
      std::size_t at = 0;
      if (auto it = writes.find(eviction.chunk); it != writes.end()) {
        auto after = std::lower_bound(it->second.begin(), it->second.end(), j);
        if (after != it->second.begin()) at = *std::prev(after) + 1;
      }
      plan.ops[at].write_back.push_back(eviction.chunk);
      plan.d2h_bytes += model.chunk_size;
      eviction.dirty = false;
    }
  }

  for (const OpPlan& op : plan.ops) {
    plan.fetches += op.fetch.size();
    plan.evictions += op.evict.size();
    for (const PlannedFetch& fetch : op.fetch) {
      if (!fetch.zero_fill) plan.h2d_bytes += model.chunk_size;
    }
  }
  return plan;
}

Plan plan_steady(const StepTrace& trace, const CostModel& model, PlanOptions options) {
  Plan plan = plan_step(trace, model, Residency{}, options);
  // Belady from two starts converges within a step or two on a repeating
  // sequence; the bound only guards against a cycle between residencies.
  for (int round = 0; round < 8 && plan.end != plan.start; ++round) {
    plan = plan_step(trace, model, plan.end, options);
  }
  return plan;
}

}  // namespace spillway::plan
