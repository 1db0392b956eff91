// OpGpuTimeline (see op_gpu_timeline.h).
#include "tracer/cupti/op_gpu_timeline.h"

#include <algorithm>

namespace spillway {

void OpGpuTimeline::add(std::span<const GpuActivity> activities,
                        std::span<const ExternalCorrelation> correlations) {
  std::lock_guard lock(mutex_);
  for (const ExternalCorrelation& correlation : correlations) {
    op_of_correlation_[correlation.correlation_id] = correlation.external_id;
  }
  // Note [Arrival order]: activities that came before their correlation
  // record, in an earlier buffer, may be joinable now.
  if (!correlations.empty() && !pending_.empty()) {
    std::erase_if(pending_, [this](const GpuActivity& activity) {
      std::optional<std::uint64_t> op_id = op_of(activity);
      if (op_id) join(*op_id, activity);
      return op_id.has_value();
    });
  }
  for (const GpuActivity& activity : activities) {
    if (std::optional<std::uint64_t> op_id = op_of(activity)) {
      join(*op_id, activity);
    } else {
      pending_.push_back(activity);
    }
  }
}

std::optional<std::uint64_t> OpGpuTimeline::op_of(const GpuActivity& activity) const {
  // Note [Two correlation ids]: the driver call's id first, then the runtime's.
  for (std::uint32_t id : {activity.correlation_id, activity.runtime_correlation_id}) {
    if (id == 0) continue;  // CUPTI never assigns 0
    if (auto found = op_of_correlation_.find(id); found != op_of_correlation_.end()) {
      return found->second;
    }
  }
  return std::nullopt;
}

void OpGpuTimeline::join(std::uint64_t op_id, const GpuActivity& activity) {
  OpActivities& op = ops_[op_id];
  if (activity.kind == GpuActivityKind::kernel) {
    ++op.totals.kernel_count;
  } else {
    ++op.totals.memcpy_count;
    op.totals.memcpy_bytes += activity.bytes;
  }
  // CUPTI reports start = end = 0 when it could not time the activity: it
  // counts, but has no interval.
  if (activity.start_ns == 0 && activity.end_ns == 0) return;
  op.intervals.emplace_back(activity.start_ns, std::max(activity.start_ns, activity.end_ns));
}

OpGpuTime OpGpuTimeline::summarize(const OpActivities& op) {
  OpGpuTime time = op.totals;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> intervals = op.intervals;
  if (intervals.empty()) return time;
  std::sort(intervals.begin(), intervals.end());
  time.first_start_ns = intervals.front().first;
  std::uint64_t run_start = intervals.front().first;
  std::uint64_t run_end = intervals.front().second;
  for (const auto& [start, end] : intervals) {
    if (start > run_end) {  // a gap: close the run
      time.busy_ns += run_end - run_start;
      run_start = start;
    }
    run_end = std::max(run_end, end);  // after a gap, end > start > old run_end
  }
  time.busy_ns += run_end - run_start;
  time.last_end_ns = run_end;  // ends only grow along the sorted runs
  return time;
}

std::optional<OpGpuTime> OpGpuTimeline::op(std::uint64_t op_id) const {
  std::lock_guard lock(mutex_);
  auto found = ops_.find(op_id);
  if (found == ops_.end()) return std::nullopt;
  return summarize(found->second);
}

std::map<std::uint64_t, OpGpuTime> OpGpuTimeline::ops() const {
  std::lock_guard lock(mutex_);
  std::map<std::uint64_t, OpGpuTime> result;
  for (const auto& [op_id, op] : ops_) result.emplace(op_id, summarize(op));
  return result;
}

std::uint64_t OpGpuTimeline::uncorrelated_count() const {
  std::lock_guard lock(mutex_);
  return pending_.size();
}

void OpGpuTimeline::clear() {
  std::lock_guard lock(mutex_);
  op_of_correlation_.clear();
  ops_.clear();
  pending_.clear();
}

}  // namespace spillway
