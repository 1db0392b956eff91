// The cost simulator's lower bound of a step, as one line of a benchmark's
// notes. tools/at_scale.sh and tests/chunksize/check_at_scale.cmake read
// this wording: change them with it.
#pragma once

#include <string>

#include <fmt/format.h>

#include "tracer/planner/cost_simulator.h"

namespace spillway::bench {

// "bound B ms (compute C, compute or link F, room R)", each in ms.
inline std::string step_bound_note(const plan::StepBound& bound) {
  return fmt::format("bound {:.1f} ms (compute {:.1f}, compute or link {:.1f}, room {:.1f})",
                     bound.bound_ns / 1e6, bound.compute_ns / 1e6, bound.flat_ns / 1e6,
                     bound.room_ns / 1e6);
}

}  // namespace spillway::bench
