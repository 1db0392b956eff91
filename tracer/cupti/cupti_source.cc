// CuptiSource (see cupti_source.h).
#include "tracer/cupti/cupti_source.h"

#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <mutex>

namespace spillway {
namespace {

// Enabled in this order, disabled in reverse. The API records are only there
// so that CUPTI emits external correlation records (it writes one before each
// API record made inside a pushed range); the translation ignores them.
constexpr std::array kRecordedKinds{
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    CUPTI_ACTIVITY_KIND_RUNTIME,
    CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_MEMCPY,
};

constexpr std::size_t kBufferBytes = 4 << 20;

// The recording source, for the buffer callbacks; the mutex lets stop() know
// that no callback is still using the source it is about to clear.
std::mutex recording_source_mutex;
CuptiSource* recording_source = nullptr;

}  // namespace

CuptiSource::CuptiSource(OpGpuTimeline& timeline, const CuptiCalls& calls)
    : timeline_(timeline), calls_(calls) {}

CuptiSource::~CuptiSource() { stop(); }

CuptiStartResult CuptiSource::start(CuptiMode mode) {
  if (mode == CuptiMode::off) {
    return {CuptiOutcome::off, "cupti:off: op timing from the wall clock"};
  }
  if (recording()) return {CuptiOutcome::recording, ""};
  std::string why = try_start();
  if (why.empty()) return {CuptiOutcome::recording, ""};
  if (mode == CuptiMode::on) {
    return {CuptiOutcome::failed, fmt::format("cupti:on, but CUPTI cannot be used: {}", why)};
  }
  return {CuptiOutcome::wall_clock,
          fmt::format("CUPTI cannot be used ({}); op timing falls back to the wall clock "
                      "(cupti:off says so without this warning)",
                      why)};
}

std::string CuptiSource::try_start() {
  {
    std::lock_guard lock(recording_source_mutex);
    if (recording_source != nullptr) {
      return "another spillway CUPTI source is recording in this process";
    }
  }
  // Claim CUPTI before touching its activity state, which belongs to
  // whoever subscribed (the PyTorch profiler's buffers must stay its own).
  CUptiResult result = calls_.subscribe(&subscriber_, &on_api_callback, nullptr);
  if (result != CUPTI_SUCCESS) {
    subscriber_ = nullptr;
    return describe_failure("cuptiSubscribe", result);
  }
  std::string why;
  result = calls_.register_callbacks(&on_buffer_requested, &on_buffer_completed);
  if (result != CUPTI_SUCCESS) why = describe_failure("cuptiActivityRegisterCallbacks", result);
  if (why.empty()) {
    std::lock_guard lock(recording_source_mutex);
    recording_source = this;
  }
  for (std::size_t i = 0; why.empty() && i < kRecordedKinds.size(); ++i) {
    result = calls_.enable(kRecordedKinds[i]);
    if (result == CUPTI_SUCCESS) {
      ++enabled_kinds_;
    } else {
      why = describe_failure("cuptiActivityEnable", result);
    }
  }
  if (!why.empty()) {
    disable_enabled_kinds();
    {
      std::lock_guard lock(recording_source_mutex);
      if (recording_source == this) recording_source = nullptr;
    }
    calls_.unsubscribe(subscriber_);
    subscriber_ = nullptr;
    return why;
  }
  recording_.store(true, std::memory_order_release);
  return "";
}

std::string CuptiSource::describe_failure(const char* call, CUptiResult result) const {
  const char* name = nullptr;
  if (calls_.result_string(result, &name) != CUPTI_SUCCESS || name == nullptr) name = "?";
  std::string what = fmt::format("{} returned {}", call, name);
  switch (result) {
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
      return what +
             ": another CUPTI client holds it (the PyTorch profiler, Nsight Systems or "
             "Compute, cuda-gdb)";
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
      return what +
             ": GPU profiling is restricted to administrators on this machine "
             "(NVreg_RestrictProfilingToAdminUsers)";
    case CUPTI_ERROR_NOT_SUPPORTED:
    case CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED:
      return what + ": not supported on this device";
    default:
      break;
  }
  // Without a driver CUPTI only says "unknown": say what it means.
  if (!calls_.driver_loadable()) return what + ": no CUDA driver (libcuda.so.1 cannot be loaded)";
  return what;
}

void CuptiSource::disable_enabled_kinds() {
  while (enabled_kinds_ > 0) calls_.disable(kRecordedKinds[--enabled_kinds_]);
}

void CuptiSource::push_op(std::uint64_t op_id) {
  if (!recording()) return;
  calls_.push_external_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, op_id);
}

void CuptiSource::pop_op() {
  if (!recording()) return;
  std::uint64_t popped = 0;
  calls_.pop_external_id(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &popped);
}

void CuptiSource::flush() {
  if (!recording()) return;
  calls_.flush_all(0);
}

void CuptiSource::stop() {
  if (!recording_.exchange(false)) return;
  disable_enabled_kinds();
  // Not under recording_source_mutex: the flush runs the completion callback
  // on this thread, and the callback takes that mutex.
  calls_.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  {
    std::lock_guard lock(recording_source_mutex);
    if (recording_source == this) recording_source = nullptr;
  }
  calls_.unsubscribe(subscriber_);
  subscriber_ = nullptr;
}

void CuptiSource::take_buffer(std::uint8_t* buffer, std::size_t valid_bytes) {
  TranslatedActivities translated;
  CUpti_Activity* record = nullptr;
  while (calls_.next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    translate_activity(*record, translated);
  }
  ignored_records_.fetch_add(translated.ignored_records, std::memory_order_relaxed);
  timeline_.add(translated.activities, translated.correlations);
}

void CUPTIAPI CuptiSource::on_buffer_requested(std::uint8_t** buffer, std::size_t* size,
                                               std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;  // CUPTI drops records when given none
  *max_records = 0;                               // as many as fit
}

void CUPTIAPI CuptiSource::on_buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer,
                                               std::size_t, std::size_t valid_bytes) {
  {
    std::lock_guard lock(recording_source_mutex);
    // A buffer that completes after stop() has no source left to go to.
    if (recording_source != nullptr && buffer != nullptr) {
      recording_source->take_buffer(buffer, valid_bytes);
    }
  }
  std::free(buffer);
}

void CUPTIAPI CuptiSource::on_api_callback(void*, CUpti_CallbackDomain, CUpti_CallbackId,
                                           const void*) {
  // Subscribed only to hold CUPTI; no callback domain is enabled.
}

}  // namespace spillway
