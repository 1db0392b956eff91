// OpGpuTimeline: the GPU time of each op, from the activities CUPTI reports
// and the external correlation records that name the op each came from.
//
// Design summary:
//  - add() takes one buffer's worth of translated records. Each activity is
//    joined to an op through its correlation id; an activity whose
//    correlation record has not arrived yet waits in `pending_` and is joined
//    when it comes, in this buffer or a later one. See Note [Arrival order].
//  - Per op it keeps counts, bytes and the activity intervals; busy time is
//    the length of the union of those intervals, computed when asked, so work
//    that overlaps on two streams counts once.
//  - An activity still pending when asked is uncorrelated: work launched
//    outside any op the hooks pushed (or whose record CUPTI dropped).
//  - One mutex: CUPTI's worker thread calls add() while the op hooks or the
//    planner read. Standard library only; no CUPTI or device types.
//
// Note [Arrival order]
// CUPTI writes the external correlation record when the launching API call
// returns and the kernel record when the kernel completes, into whatever
// buffer is current on each side, and buffers complete out of order. So either
// may come first, in the same buffer or another one; the join must not depend
// on which.
//
// The timeline grows with the activities it has seen: it is meant for the
// traced (warmup) steps; clear() drops everything once they are read.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tracer/cupti/gpu_activity.h"

namespace spillway {

struct OpGpuTime {
  std::uint64_t kernel_count = 0;
  std::uint64_t memcpy_count = 0;
  std::uint64_t memcpy_bytes = 0;
  std::uint64_t first_start_ns = 0;  // earliest start of the op's activities
  std::uint64_t last_end_ns = 0;     // latest end
  std::uint64_t busy_ns = 0;         // union of the activity intervals

  friend bool operator==(const OpGpuTime&, const OpGpuTime&) = default;
};

class OpGpuTimeline {
 public:
  // One completed CUPTI buffer, joined under one lock.
  void add(std::span<const GpuActivity> activities,
           std::span<const ExternalCorrelation> correlations);

  // The GPU time of op `op_id`, or nothing when no activity joined it (yet).
  std::optional<OpGpuTime> op(std::uint64_t op_id) const;
  // Every op with at least one activity, by op id.
  std::map<std::uint64_t, OpGpuTime> ops() const;
  // Activities no correlation record has named an op for (so far).
  std::uint64_t uncorrelated_count() const;

  void clear();

 private:
  struct OpActivities {
    OpGpuTime totals;  // busy_ns left 0 here; computed from `intervals` when read
    std::vector<std::pair<std::uint64_t, std::uint64_t>> intervals;
  };

  // The op `activity` belongs to, if its correlation record has arrived.
  std::optional<std::uint64_t> op_of(const GpuActivity& activity) const;
  void join(std::uint64_t op_id, const GpuActivity& activity);
  static OpGpuTime summarize(const OpActivities& op);

  mutable std::mutex mutex_;
  std::unordered_map<std::uint32_t, std::uint64_t> op_of_correlation_;
  std::unordered_map<std::uint64_t, OpActivities> ops_;
  std::vector<GpuActivity> pending_;
};

}  // namespace spillway
