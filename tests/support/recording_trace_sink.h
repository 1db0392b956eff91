// RecordingTraceSink: a TraceSink that keeps every event in memory, for tests
// that check what the allocator or the chunk manager recorded.
#pragma once

#include <mutex>
#include <vector>

#include "tracer/trace_event.h"

namespace spillway::testing {

class RecordingTraceSink final : public TraceSink {
 public:
  void record(const TraceEvent& event) override {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
  }
  void record_together(std::span<const TraceEvent> events) override {
    std::lock_guard lock(mutex_);
    events_.insert(events_.end(), events.begin(), events.end());
  }
  std::vector<TraceEvent> events() const {
    std::lock_guard lock(mutex_);
    return events_;
  }
  std::vector<TraceEvent> of_kind(TraceEventKind kind) const {
    std::lock_guard lock(mutex_);
    std::vector<TraceEvent> out;
    for (const TraceEvent& event : events_)
      if (event.kind == kind) out.push_back(event);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<TraceEvent> events_;
};

}  // namespace spillway::testing
