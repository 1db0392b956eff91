// Planner: turns one traced step into an eviction and prefetch plan (design
// section 5).
//
// Eviction is Belady's: when an op needs room, the resident chunk whose next
// use is farthest leaves, where "next" looks past the end of the step into
// the next step's repetition of the same sequence (a training step repeats).
// Ties go to clean chunks, which leave for free. Belady minimises the number
// of fetches for a fixed capacity; here the capacity varies per moment, as
// the chunk budget of a moment is what the non-model peak of that moment
// leaves of the device budget.
//
// Prefetch: each fetch is then moved as early as it can go, so that its
// modelled copy has the most time to end before its use. Its victim leaves
// right after the victim's last use; the fetch starts then, or sooner over
// moments that have a chunk to spare (it then holds one more chunk there).
// Neither goes before an earlier eviction of the fetched chunk, nor ahead
// of an earlier-needed fetch (one copy stream per direction is a FIFO).
// Every moment's resident count, chunks in flight included, stays within
// its budget: a moved fetch either swaps places with its moved victim or
// takes a spare chunk.
//
// Write-back: a dirty victim is copied to the host right after its last
// write, while it stays resident, so its eviction is free and the fetch
// into its room does not wait for a device-to-host copy.
//
// Dead bytes: a chunk whose next use is fresh (ChunkUse::fresh) holds
// nothing worth keeping after its use before, so from then on it is clean (it
// leaves without a write-back), and its fetch for the fresh use is a zero
// fill: no bytes, no copy time, and no place in the fetch FIFO (it has a
// stream of its own at run time), so it is issued at its use.
//
// Headroom: the tightest moment of a step sets how many chunks must move, so
// at roomier moments (the optimizer phase, without activations) a chunk or
// two can often be left free at no cost in bytes; fetches then start before
// the op before them ends (PlanOptions::headroom_reserve, headroom.h).
#pragma once

#include <cstddef>
#include <map>
#include <stdexcept>
#include <vector>

#include "tracer/planner/step_trace.h"

namespace spillway::plan {

// Resident chunks and whether each is dirty.
using Residency = std::map<PlanChunk, bool>;

struct PlannedEviction {
  PlanChunk chunk = 0;
  bool dirty = false;
};

struct PlannedFetch {
  PlanChunk chunk = 0;
  std::size_t use_op = 0;  // the op that needs it
  // Its use is fresh (ChunkUse::fresh): zeroed on the device, no copy.
  bool zero_fill = false;
};

// What to do when the compute stream reaches an op, before the op runs:
// write-backs (a dirty chunk copied to the host after its last write, so
// its later eviction is free and the fetch into its room need not wait for
// it), evictions (their room is what the fetches fill), then fetches.
struct OpPlan {
  std::vector<PlanChunk> write_back;
  std::vector<PlannedEviction> evict;
  std::vector<PlannedFetch> fetch;
};

struct Plan {
  std::vector<OpPlan> ops;  // one per traced op
  Residency start;          // resident when the step begins
  Residency end;            // resident when it ends
  std::size_t fetches = 0;
  std::size_t evictions = 0;
  std::uint64_t h2d_bytes = 0;
  std::uint64_t d2h_bytes = 0;
};

struct PlanOptions {
  // Next use looks into the next step's repetition; off for a one-off
  // sequence (offline Belady over a whole run).
  bool cyclic = true;
  // Off: every fetch is issued at the op that needs it.
  bool prefetch = true;
  // Chunks of each moment's budget the Belady pass leaves free, so that a
  // fetch can start while the chunk it replaces is still in use (Belady's
  // victim is often the chunk the previous op just used). Costs fetches,
  // buys overlap; on the GPT benchmarks one op's worth cost more than it
  // gained (docs/planner.md), hence 0, pure Belady.
  std::size_t prefetch_reserve = 0;
  // Chunks the Belady pass leaves free at each moment, taken only from the
  // room that moment has above the step's tightest moment. The tightest
  // moment sets how many chunks must move, so this room can often be spared
  // at no cost in bytes, and a free chunk lets a fetch start before the op
  // before it ends and without waiting for its victim's write-back (the
  // optimizer phase). Whether it is free for a trace is checked by
  // choose_headroom_reserve (headroom.h).
  std::size_t headroom_reserve = 0;
  // simulate()'s planned policy replaces headroom_reserve with
  // choose_headroom_reserve's pick; plan_step and plan_steady ignore this.
  bool choose_headroom = true;
};

// A step that cannot run within the budget: the message names the op and
// the bytes it needs.
class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// For each op, the chunks whose bytes are dead after it: their next use,
// into the next step's repetition, is fresh (ChunkUse::fresh).
std::vector<std::vector<PlanChunk>> dead_after(const StepTrace& trace);
// Whether op's use of `chunk` is fresh.
bool fresh_use(const TracedOp& op, PlanChunk chunk);

// Chunks that fit beside each op's non-model bytes. Throws PlanError when an
// op's own chunks and non-model bytes do not fit.
std::vector<std::size_t> chunk_capacity(const StepTrace& trace, const CostModel& model);
// The smallest device budget chunk_capacity accepts: the largest op's
// distinct chunks (model.chunk_size each), non-model bytes and margin.
std::uint64_t smallest_budget(const StepTrace& trace, const CostModel& model);

// The plan for one step starting from `start` (extra resident chunks beyond
// the first op's capacity are evicted before it).
Plan plan_step(const StepTrace& trace, const CostModel& model, const Residency& start,
               PlanOptions options = {});

// The plan of the repeating step: planned from an empty device, then again
// from where the previous plan ended until the start residency repeats.
Plan plan_steady(const StepTrace& trace, const CostModel& model, PlanOptions options = {});

}  // namespace spillway::plan
