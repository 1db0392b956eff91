// Activity translation (see activity_translation.h).
#include "tracer/cupti/activity_translation.h"

#include <cstddef>

namespace spillway {
namespace {

// The kernel and memcpy records of this CUPTI release. Note [Record versions].
#if defined(CUPTI_API_VERSION) && CUPTI_API_VERSION >= 130000
using KernelRecord = CUpti_ActivityKernel10;
#else
using KernelRecord = CUpti_ActivityKernel9;
#endif
using MemcpyRecord = CUpti_ActivityMemcpy6;

#define SPILLWAY_SAME_OFFSET(a, b, field) \
  static_assert(offsetof(a, field) == offsetof(b, field), #field " moved between " #a " and " #b)
SPILLWAY_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel9, start);
SPILLWAY_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel9, end);
SPILLWAY_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel9, deviceId);
SPILLWAY_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel9, streamId);
SPILLWAY_SAME_OFFSET(KernelRecord, CUpti_ActivityKernel9, correlationId);
SPILLWAY_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy5, bytes);
SPILLWAY_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy5, start);
SPILLWAY_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy5, correlationId);
SPILLWAY_SAME_OFFSET(MemcpyRecord, CUpti_ActivityMemcpy5, runtimeCorrelationId);
#undef SPILLWAY_SAME_OFFSET

GpuActivity from_kernel(const KernelRecord& kernel) {
  GpuActivity activity;
  activity.kind = GpuActivityKind::kernel;
  activity.start_ns = kernel.start;
  activity.end_ns = kernel.end;
  activity.correlation_id = kernel.correlationId;
  activity.stream_id = kernel.streamId;
  activity.device_id = kernel.deviceId;
  return activity;
}

GpuActivity from_memcpy(const MemcpyRecord& copy) {
  GpuActivity activity;
  activity.kind = GpuActivityKind::memcpy;
  activity.start_ns = copy.start;
  activity.end_ns = copy.end;
  activity.correlation_id = copy.correlationId;
  activity.runtime_correlation_id = copy.runtimeCorrelationId;
  activity.bytes = copy.bytes;
  activity.direction = copy_direction(copy.copyKind);
  activity.stream_id = copy.streamId;
  activity.device_id = copy.deviceId;
  return activity;
}

}  // namespace

CopyDirection copy_direction(std::uint8_t cupti_copy_kind) {
  switch (cupti_copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA:
      return CopyDirection::host_to_device;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH:
      return CopyDirection::device_to_host;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
      return CopyDirection::device_to_device;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return CopyDirection::host_to_host;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return CopyDirection::peer_to_peer;
    default:
      return CopyDirection::none;
  }
}

void translate_activity(const CUpti_Activity& record, TranslatedActivities& out) {
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL:
      out.activities.push_back(from_kernel(reinterpret_cast<const KernelRecord&>(record)));
      return;
    case CUPTI_ACTIVITY_KIND_MEMCPY:
      out.activities.push_back(from_memcpy(reinterpret_cast<const MemcpyRecord&>(record)));
      return;
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto& correlation = reinterpret_cast<const CUpti_ActivityExternalCorrelation&>(record);
      // Only the op hooks' kind: another library's ids (OpenACC, a profiler's
      // CUSTOM1) would name ops that are not ours.
      if (correlation.externalKind != CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) break;
      out.correlations.push_back({correlation.correlationId, correlation.externalId});
      return;
    }
    default:
      break;
  }
  ++out.ignored_records;
}

}  // namespace spillway
