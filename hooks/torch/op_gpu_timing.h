// OpGpuTiming: the GPU time of the traced ops, from CUPTI (design section 5).
//
// Design summary:
//  - While spillway writes a trace on a CUDA device, the op hooks push each
//    traced op's sequence number (Note [Op events] in tracer/op_tracer.h) as
//    CUPTI's external correlation id around the op's body, and CUPTI's kernel
//    and memcpy records are joined with those ops in an OpGpuTimeline
//    (tracer/cupti/cupti_source.h). Each step's end hands CUPTI's completed
//    buffers to the timeline.
//  - Everywhere else op timing is the wall clock: the duration op_end
//    records. That is the case on the sim device (CUPTI sees CUDA work only;
//    said in the stats, no warning), without a trace (no ops are numbered),
//    in a build without CUPTI, and with `cupti:auto` where CUPTI cannot be
//    used (one warning, Note [One warning] in op_gpu_timing.cc). `cupti:on` where CUPTI cannot be
//    used makes activation fail with the reason.
//  - memory_stats_json()'s "op_timing" says which, and what was joined:
//    {source, reason, ops, kernels, memcpys, uncorrelated}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace spillway {
class Runtime;
}

namespace spillway::torch_bridge {

class OpGpuTiming {
 public:
  // The process's, for the op hooks.
  static OpGpuTiming& process();

  OpGpuTiming();
  ~OpGpuTiming();
  OpGpuTiming(const OpGpuTiming&) = delete;
  OpGpuTiming& operator=(const OpGpuTiming&) = delete;

  // Chooses the source once the runtime is active (the hooks' activation).
  // Throws std::runtime_error when `cupti:on` and CUPTI cannot be used.
  void start(const Runtime& runtime);
  // True while CUPTI records: only then do push_op/pop_op matter.
  bool recording() const;
  // Bracket a traced op's body on the calling thread.
  void push_op(std::uint64_t sequence);
  void pop_op();
  // A step ended: completed CUPTI buffers reach the timeline.
  void on_step_end();
  // memory_stats_json()'s "op_timing".
  nlohmann::ordered_json stats() const;

 private:
  struct Cupti;  // the source and its timeline, where CUPTI is built
  std::unique_ptr<Cupti> cupti_;
  std::string source_ = "wall_clock";
  std::string reason_ = "not active";
};

namespace detail {
// Logs a CUPTI fallback (CuptiOutcome::wall_clock's message) as a warning,
// the first time in the process only (Note [One warning] in
// op_gpu_timing.cc).
void warn_cupti_fallback_once(const std::string& message);
// Lets a test see the once-per-process warning again. Tests only.
void forget_cupti_fallback_warning();
}  // namespace detail

}  // namespace spillway::torch_bridge
