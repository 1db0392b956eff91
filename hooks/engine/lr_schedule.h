// LrSchedule: DeepSpeed's learning-rate schedulers (WarmupLR, WarmupDecayLR,
// WarmupCosineLR, OneCycle, LRRangeTest) without torch, giving the very
// doubles DeepSpeed's param group holds at every step (the arithmetic follows
// deepspeed/runtime/lr_schedules.py operation by operation; the parity test
// checks it bit for bit against DeepSpeed itself).
//
// How DeepSpeed's engine drives its scheduler, and so how spillway's must:
//   1. Construction, right after the optimizer: the scheduler may set the
//      optimizer's lr (and, OneCycle with cycle_momentum on an optimizer with
//      betas, its betas) at once. lr() is then what the param group holds,
//      which is what the first optimizer step uses, what engine.get_lr()
//      returns before any step. (WarmupCosineLR starts at lr 0: DeepSpeed's
//      "before it has started" path.)
//   2. Each optimizer step that is applied uses lr() and, when betas() has a
//      value, betas() in place of the optimizer's configured betas.
//   3. After an applied step, step(). A step skipped for an fp16 overflow does
//      not call step(): the lr stays, as in DeepSpeed.
// SGD's momentum is never changed (DeepSpeed's OneCycle cycles momentum only
// on optimizers with betas, and warns and stops cycling on others).
//
// State is last_batch_iteration() alone, as DeepSpeed's state_dict; restore()
// sets it and the lr (and betas) the optimizer held at that point, which
// DeepSpeed gets back from the optimizer's own checkpoint.
#pragma once

#include <optional>

#include "hooks/engine/engine_config.h"
#include "hooks/engine/lr_schedule_config.h"

namespace spillway::engine {

// Adam's (beta1, beta2) as a scheduler sets them. DeepSpeed's OneCycle writes
// beta2 0.99 along with every beta1, whatever the optimizer's beta2 was.
struct AdamBetas {
  double beta1 = 0;
  double beta2 = 0;
};

class LrSchedule {
 public:
  // `optimizer` gives the base lr (WarmupCosineLR scales it; WarmupLR warms
  // up to it by default), its type (whether it has betas) and betas.
  LrSchedule(const LrScheduleConfig& config, const OptimizerConfig& optimizer);

  // The lr the optimizer holds now: the next applied step uses it.
  double lr() const { return lr_; }
  // The betas the optimizer holds now when the schedule set them; nullopt:
  // the optimizer's configured betas (or SGD's momentum) are unchanged.
  const std::optional<AdamBetas>& betas() const { return betas_; }

  // Advances by one applied optimizer step and sets lr() (and betas()).
  void step();

  // DeepSpeed's last_batch_iteration: -1 before the first step(), then the
  // number of step() calls less one (plus any configured starting value).
  long long last_batch_iteration() const { return last_batch_iteration_; }

  // Resumes from a saved last_batch_iteration(): lr() and betas() become
  // those the optimizer held when it was saved. Throws std::invalid_argument
  // for a value below -1.
  void restore(long long last_batch_iteration);

 private:
  // DeepSpeed's get_lr() / get_mom() at last_batch_iteration_ (>= 0).
  double scheduled_lr() const;
  std::optional<AdamBetas> scheduled_betas() const;
  // Sets lr_ and betas_ as DeepSpeed's constructor leaves the param group.
  void set_starting_values();

  double warmup_gamma() const;
  double cosine_ratio() const;
  double one_cycle_scale() const;

  LrScheduleConfig config_;
  double base_lr_;
  std::optional<AdamBetas> base_betas_;  // nullopt: SGD
  bool cycles_momentum_;
  long long warmup_steps_;   // max(2, warmup_num_steps)
  double max_lr_;            // WarmupLR/WarmupDecayLR's end of warmup
  double cycle_total_size_;  // OneCycle: first + second step size
  double cycle_step_ratio_;  // OneCycle: first / total
  long long last_batch_iteration_;
  double lr_ = 0;
  std::optional<AdamBetas> betas_;
};

}  // namespace spillway::engine
