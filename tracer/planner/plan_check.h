// check_plan: replays a plan op by op and says what is wrong with it, if
// anything: a needed chunk not resident, a chunk fetched twice or evicted
// while absent or needed, or more chunks resident (or in flight) at some
// moment than that moment's chunk budget. Tests use it on every plan; the
// simulator trusts plans that pass it.
#pragma once

#include <optional>
#include <string>

#include "tracer/planner/planner.h"

namespace spillway::plan {

std::optional<std::string> check_plan(const StepTrace& trace, const CostModel& model,
                                      const Plan& plan);

}  // namespace spillway::plan
