#include "hooks/engine/lr_schedule_config.h"

namespace spillway::engine {

const char* to_string(LrScheduleType type) {
  switch (type) {
    case LrScheduleType::warmup_lr:
      return "WarmupLR";
    case LrScheduleType::warmup_decay_lr:
      return "WarmupDecayLR";
    case LrScheduleType::warmup_cosine_lr:
      return "WarmupCosineLR";
    case LrScheduleType::one_cycle:
      return "OneCycle";
    case LrScheduleType::lr_range_test:
      return "LRRangeTest";
  }
  return "?";
}

}  // namespace spillway::engine
