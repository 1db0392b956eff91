// CuptiSource: CUPTI's kernel and memcpy activity, joined with the ops the op
// hooks push, into an OpGpuTimeline.
//
// Design summary:
//  - start(mode) claims CUPTI (cuptiSubscribe: CUPTI allows one client, and
//    the PyTorch profiler, Nsight or cuda-gdb may hold it), registers the
//    buffer callbacks and enables concurrent kernel, memcpy and external
//    correlation records, plus the runtime and driver API records without
//    which CUPTI emits no correlation records.
//  - push_op(id) / pop_op() bracket an op on the calling thread: CUPTI tags
//    every API call in between with `id` (CUSTOM0 external correlation), the
//    innermost id when ops nest. See Note [Op ids].
//  - CUPTI hands back full buffers on its own thread; each is translated
//    (activity_translation.h) and added to the timeline there, so readers of
//    the timeline see it grow. flush() hands back what is complete now.
//  - When CUPTI cannot be used, `cupti:auto` falls back to wall-clock op
//    timing and says why in the result (the hooks warn, once per process:
//    Note [One warning] in hooks/torch/op_gpu_timing.cc); `cupti:on` fails
//    with the reason; `cupti:off` never touches CUPTI.
//
// At most one source records in a process: the buffer callbacks carry no
// user data, so they reach the recording source through one process-wide
// pointer (and CUPTI admits one subscriber anyway).
//
// The source says what happened in its results and logs nothing: telling
// the user is the hooks' part, so tracer/ depends on nothing above it.
//
// Note [Op ids]
// The id pushed is the op hooks' op sequence number, the same number the op's
// trace events carry, so timeline entries and trace events join on it. CUPTI
// keeps a stack per thread and kind: push and pop must pair on one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "tracer/cupti/activity_translation.h"
#include "tracer/cupti/cupti_calls.h"
#include "tracer/cupti/cupti_mode.h"
#include "tracer/cupti/op_gpu_timeline.h"

namespace spillway {

enum class CuptiOutcome {
  recording,   // CUPTI records; op GPU times arrive in the timeline
  off,         // cupti:off: CUPTI untouched, op timing from the wall clock
  wall_clock,  // cupti:auto and CUPTI unusable: op timing from the wall clock
  failed,      // cupti:on and CUPTI unusable: an error
};

struct CuptiStartResult {
  CuptiOutcome outcome = CuptiOutcome::off;
  std::string message;  // why, whenever the outcome is not `recording`

  bool ok() const { return outcome != CuptiOutcome::failed; }
};

class CuptiSource {
 public:
  explicit CuptiSource(OpGpuTimeline& timeline, const CuptiCalls& calls = real_cupti_calls());
  ~CuptiSource();  // stops
  CuptiSource(const CuptiSource&) = delete;
  CuptiSource& operator=(const CuptiSource&) = delete;

  // Starts recording as `mode` says; starting a recording source again is a
  // no-op that reports `recording`.
  CuptiStartResult start(CuptiMode mode);
  bool recording() const { return recording_.load(std::memory_order_acquire); }

  // Bracket one op on the calling thread (no-ops unless recording).
  void push_op(std::uint64_t op_id);
  void pop_op();

  // Hands every buffer whose records are complete to the timeline before
  // returning. Synchronize the device first to include work still running.
  void flush();
  // Hands back everything (complete or not), disables the records and
  // releases CUPTI. The timeline keeps what it has.
  void stop();

  // Records of kinds the timeline does not use (API records, mostly).
  std::uint64_t ignored_records() const { return ignored_records_.load(); }

 private:
  std::string try_start();  // "" on success, else why CUPTI cannot be used
  std::string describe_failure(const char* call, CUptiResult result) const;
  void disable_enabled_kinds();
  void take_buffer(std::uint8_t* buffer, std::size_t valid_bytes);

  static void CUPTIAPI on_buffer_requested(std::uint8_t** buffer, std::size_t* size,
                                           std::size_t* max_records);
  static void CUPTIAPI on_buffer_completed(CUcontext context, std::uint32_t stream_id,
                                           std::uint8_t* buffer, std::size_t size,
                                           std::size_t valid_bytes);
  static void CUPTIAPI on_api_callback(void* user_data, CUpti_CallbackDomain domain,
                                       CUpti_CallbackId id, const void* data);

  OpGpuTimeline& timeline_;
  const CuptiCalls& calls_;
  CUpti_SubscriberHandle subscriber_ = nullptr;
  int enabled_kinds_ = 0;  // how many of kRecordedKinds are enabled, in order
  std::atomic<bool> recording_{false};
  std::atomic<std::uint64_t> ignored_records_{0};
};

}  // namespace spillway
