// Recommendations: a few plain sentences derived from the report's numbers,
// each naming the numbers it rests on. Rules, in order:
//  - out-of-memories: how many, and the largest failed request;
//  - peak reserved under half the device budget: the budget could be lowered;
//  - chunk bytes moved per step above twice the model's size: a bigger budget
//    or another placement policy would move less;
//  - host stalls above 10% of the traced time;
//  - peak reserved over 1.3x peak allocated: fragmentation, try chunk_size.
// When none applies, one sentence says so.
#pragma once

#include <string>
#include <vector>

#include "tools/report/report_model.h"

namespace spillway::report {

std::vector<std::string> recommendations(const ReportModel& model);

}  // namespace spillway::report
