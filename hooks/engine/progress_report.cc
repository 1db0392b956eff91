#include "hooks/engine/progress_report.h"

#include <fmt/format.h>

namespace spillway::engine {
namespace {

// Python's repr of a float: the shortest round-trip digits, with ".0" on
// integral values (fmt's "{}" writes 1 where Python writes 1.0).
std::string python_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

std::string progress_line(unsigned long long step, unsigned long long skipped,
                          const std::vector<double>& lrs, const GroupMomentum& momentum) {
  std::string lr_list;
  for (double lr : lrs) lr_list += (lr_list.empty() ? "" : ", ") + python_float(lr);
  std::string mom_list;
  if (momentum.sgd) {
    for (double m : momentum.momentum) mom_list += (mom_list.empty() ? "" : ", ") + python_float(m);
  } else {
    for (const auto& [beta1, beta2] : momentum.betas)
      mom_list += fmt::format("{}({}, {})", mom_list.empty() ? "" : ", ", python_float(beta1),
                              python_float(beta2));
  }
  return fmt::format("[Rank 0] step={}, skipped={}, lr=[{}], mom=[{}]", step, skipped, lr_list,
                     mom_list);
}

std::string timers_line(const StepTimes& times, bool micro) {
  const char* suffix = micro ? "_microstep" : "";
  return fmt::format(
      "[Rank 0] time (ms) | fwd{0}: {1:.2f} | bwd{0}: {2:.2f} | bwd_inner{0}: {2:.2f} | "
      "bwd_allreduce{0}: {3:.2f} | step{0}: {4:.2f}",
      suffix, times.forward_ms, times.backward_ms, 0.0, times.step_ms);
}

}  // namespace spillway::engine
