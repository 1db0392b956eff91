// The lines DeepSpeed 0.18's engine prints for steps_per_print and
// wall_clock_breakdown, in its format, so a log a DeepSpeed user reads (or
// parses) looks the same under spillway:
//   [Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]
//   [Rank 0] time (ms) | fwd_microstep: 1.20 | bwd_microstep: 3.40 | ...
//   [Rank 0] time (ms) | fwd: 4.80 | bwd: 13.60 | ... | step: 2.10
// Numbers follow Python's str(): the shortest repr of a double, tuples in
// parentheses.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace spillway::engine {

// The momentum column: SGD's momentum per group, or Adam's betas per group.
struct GroupMomentum {
  bool sgd = false;
  std::vector<double> momentum;                  // sgd
  std::vector<std::pair<double, double>> betas;  // otherwise
};

// DeepSpeed's _report_progress line for optimizer step `step` (1-based).
std::string progress_line(unsigned long long step, unsigned long long skipped,
                          const std::vector<double>& lrs, const GroupMomentum& momentum);

// Milliseconds spent in forward, backward and the optimizer step since the
// last print.
struct StepTimes {
  double forward_ms = 0;
  double backward_ms = 0;
  double step_ms = 0;
};

// wall_clock_breakdown's line after every engine step (`micro` true: the
// *_microstep timers) or at an accumulation boundary (the window's sums).
// One process: backward is all inner work and no all-reduce (0.00).
std::string timers_line(const StepTimes& times, bool micro);

}  // namespace spillway::engine
