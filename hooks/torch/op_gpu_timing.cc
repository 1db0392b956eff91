// OpGpuTiming: see op_gpu_timing.h.
#include "hooks/torch/op_gpu_timing.h"

#include <atomic>
#include <stdexcept>

#include "allocator/config/log.h"
#include "allocator/runtime.h"
#include "tracer/cupti/op_gpu_timeline.h"
#if SPILLWAY_HAVE_CUPTI
#include "tracer/cupti/cupti_source.h"
#endif

namespace spillway::torch_bridge {

// Note [One warning]
// A process may start op timing many times (each activation, each engine);
// the CUPTI fallback is the same every time, so it is said once. Later
// fallbacks keep the same reason in the stats without a log line.
namespace {
std::atomic<bool> cupti_fallback_warned{false};
}  // namespace

namespace detail {
void warn_cupti_fallback_once(const std::string& message) {
  if (!cupti_fallback_warned.exchange(true)) SPILLWAY_LOG(warn, "{}", message);
}
void forget_cupti_fallback_warning() { cupti_fallback_warned.store(false); }
}  // namespace detail

struct OpGpuTiming::Cupti {
  OpGpuTimeline timeline;
#if SPILLWAY_HAVE_CUPTI
  CuptiSource source{timeline};
#endif
};

OpGpuTiming& OpGpuTiming::process() {
  static OpGpuTiming timing;
  return timing;
}

OpGpuTiming::OpGpuTiming() = default;
OpGpuTiming::~OpGpuTiming() = default;

void OpGpuTiming::start(const Runtime& runtime) {
  const CuptiMode mode = runtime.config().cupti;
  if (mode == CuptiMode::off) {
    reason_ = "cupti:off";
    return;
  }
  if (runtime.device().kind() != DeviceKind::cuda) {
    if (mode == CuptiMode::on)
      throw std::runtime_error("spillway: cupti:on needs device cuda; CUPTI sees CUDA work only");
    reason_ = "the sim device: CUPTI sees CUDA work only";
    return;
  }
  if (runtime.op_tracer() == nullptr) {
    // Ops are numbered only in a trace; a timeline of unnumbered ops joins nothing.
    reason_ = "no trace option: ops are numbered only in a trace";
    return;
  }
#if SPILLWAY_HAVE_CUPTI
  cupti_ = std::make_unique<Cupti>();
  const CuptiStartResult started = cupti_->source.start(mode);
  if (started.outcome == CuptiOutcome::failed) {
    cupti_.reset();
    throw std::runtime_error("spillway: cupti:on: " + started.message);
  }
  if (started.outcome == CuptiOutcome::recording) {
    source_ = "cupti";
    reason_.clear();
  } else {
    reason_ = started.message;
    detail::warn_cupti_fallback_once(started.message);
    cupti_.reset();
  }
#else
  if (mode == CuptiMode::on)
    throw std::runtime_error("spillway: cupti:on, but this build has no CUPTI (no CUDA toolkit)");
  reason_ = "built without CUPTI";
#endif
}

bool OpGpuTiming::recording() const {
#if SPILLWAY_HAVE_CUPTI
  return cupti_ != nullptr && cupti_->source.recording();
#else
  return false;
#endif
}

void OpGpuTiming::push_op(std::uint64_t sequence) {
#if SPILLWAY_HAVE_CUPTI
  if (cupti_ != nullptr) cupti_->source.push_op(sequence);
#else
  (void)sequence;
#endif
}

void OpGpuTiming::pop_op() {
#if SPILLWAY_HAVE_CUPTI
  if (cupti_ != nullptr) cupti_->source.pop_op();
#endif
}

void OpGpuTiming::on_step_end() {
#if SPILLWAY_HAVE_CUPTI
  if (cupti_ != nullptr) cupti_->source.flush();
#endif
}

nlohmann::ordered_json OpGpuTiming::stats() const {
  nlohmann::ordered_json json = {{"source", source_}, {"reason", reason_}};
  std::uint64_t kernels = 0;
  std::uint64_t memcpys = 0;
  std::uint64_t ops = 0;
  std::uint64_t uncorrelated = 0;
  if (cupti_ != nullptr) {
    for (const auto& [sequence, time] : cupti_->timeline.ops()) {
      ++ops;
      kernels += time.kernel_count;
      memcpys += time.memcpy_count;
    }
    uncorrelated = cupti_->timeline.uncorrelated_count();
  }
  json["ops"] = ops;
  json["kernels"] = kernels;
  json["memcpys"] = memcpys;
  json["uncorrelated"] = uncorrelated;
  return json;
}

}  // namespace spillway::torch_bridge
