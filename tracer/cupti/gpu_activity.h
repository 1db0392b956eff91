// GpuActivity: one kernel or memory copy that ran on a GPU, as the CUPTI
// source reports it, in standard types only (no CUPTI or CUDA handles), so
// the op timeline and anything above it build and test without CUDA.
//
// Times are CUPTI timestamps in nanoseconds: one clock for every activity of
// a process, comparable with each other but not with the wall clock.
#pragma once

#include <cstdint>

namespace spillway {

enum class GpuActivityKind : std::uint8_t { kernel, memcpy };

// Which memories a copy moved between. CUPTI's array kinds fold into the
// side they live on (an array is device memory).
enum class CopyDirection : std::uint8_t {
  none,  // not a copy (kernels), or a copy kind CUPTI did not name
  host_to_device,
  device_to_host,
  device_to_device,
  host_to_host,
  peer_to_peer,
};

struct GpuActivity {
  GpuActivityKind kind = GpuActivityKind::kernel;
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  // CUPTI's id of the API call that launched the work: the key that external
  // correlation records map to an op. See Note [Two correlation ids].
  std::uint32_t correlation_id = 0;
  std::uint32_t runtime_correlation_id = 0;  // memcpy only; 0 when unknown
  std::uint64_t bytes = 0;                   // memcpy only
  CopyDirection direction = CopyDirection::none;
  std::uint32_t stream_id = 0;
  std::uint32_t device_id = 0;

  friend bool operator==(const GpuActivity&, const GpuActivity&) = default;
};

// "The API call with this correlation id ran inside op `external_id`": what a
// CUPTI external correlation record says, for the ids the op hooks push.
struct ExternalCorrelation {
  std::uint32_t correlation_id = 0;
  std::uint64_t external_id = 0;

  friend bool operator==(const ExternalCorrelation&, const ExternalCorrelation&) = default;
};

// Note [Two correlation ids]
// A memcpy record carries the correlation id of the driver API call that
// issued it and, separately, that of the runtime API call (cudaMemcpyAsync)
// above it. The external correlation records come for whichever API records
// CUPTI creates, so the timeline tries the first, then the second. A kernel
// record has one id, that of the call that launched it.

}  // namespace spillway
