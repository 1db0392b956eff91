// fastest_known_plan: the shortest steady step the cost simulator finds for
// a trace, over the planner's options and offline Belady.
//
// step_bound (cost_simulator.h) is a lower bound on any schedule's step; the
// planned policy's step is one schedule's, chosen for bytes first
// (choose_headroom_reserve refuses headroom that moves more). Between the
// two, this is the best the simulator knows: the planned policy under each
// prefetch reserve and headroom of a small grid, and offline Belady with
// prefetch, compared by their mean steady step. The best step any schedule
// can reach lies between step_bound and this, so a goal of "at most x times
// the bound" is out of every known schedule's reach where this is above x:
// the benchmarks print it beside the bound (docs/planner.md, "How far the
// bound is from the best known plan").
#pragma once

#include <cstddef>
#include <string>

#include "tracer/planner/cost_simulator.h"
#include "tracer/planner/planner.h"
#include "tracer/planner/step_trace.h"

namespace spillway::plan {

struct FastestPlan {
  SimResult result;              // its simulation (policy planned or belady)
  PlanOptions options;           // the planned policy's; meaningless for belady
  double steady_step_ns = 0;     // the mean of its steps after the first two
  std::string describe() const;  // "planned, prefetch reserve 0, headroom 1" or "belady"
};

// The grid: prefetch reserve 0..kFastestMaxReserve, headroom
// 0..kFastestMaxHeadroom (PlanOptions, headroom choice off).
inline constexpr std::size_t kFastestMaxReserve = 2;
inline constexpr std::size_t kFastestMaxHeadroom = 4;

// Simulates `steps` steps (at least 3) of each candidate. Throws PlanError
// when no candidate can run the trace (an op does not fit the budget).
FastestPlan fastest_known_plan(const StepTrace& trace, const CostModel& model,
                               std::size_t steps = 6);

}  // namespace spillway::plan
