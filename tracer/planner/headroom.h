// choose_headroom_reserve: the PlanOptions::headroom_reserve for a trace.
//
// Headroom (free chunks above the step's tightest moment) lets fetches
// overlap the op before them and skip waiting for their victim's
// write-back, but on some traces it also costs fetches. The pick is the
// headroom whose steady simulated step is shortest among those that move no
// more bytes per steady step than none does; ties (within 0.1%) go to less
// headroom, which moves fewer bytes on the way from another residency. It
// needs only what the planner has: the trace, its op durations and the cost
// model.
#pragma once

#include <cstddef>

#include "tracer/planner/planner.h"
#include "tracer/planner/step_trace.h"

namespace spillway::plan {

// Tries 0..max_headroom with the rest of `options`. Throws PlanError when an
// op does not fit.
std::size_t choose_headroom_reserve(const StepTrace& trace, const CostModel& model,
                                    PlanOptions options, std::size_t max_headroom = 4);

}  // namespace spillway::plan
