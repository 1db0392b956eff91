#include "allocator/caching/deferred_frees.h"

namespace spillway {

DeferredFrees::DeferredFrees(Device& device) : device_(device) {}

DeferredFrees::~DeferredFrees() {
  for (Event event : all_events_) device_.destroy_event(event);
}

bool DeferredFrees::acquire_event(Event* event) {
  if (!spare_events_.empty()) {
    *event = spare_events_.back();
    spare_events_.pop_back();
    return true;
  }
  if (device_.create_event(event) != Status::ok) return false;
  all_events_.push_back(*event);
  return true;
}

int DeferredFrees::defer(Block* block) {
  int recorded = 0;
  for (Stream stream : block->used_on_streams) {
    Event event;
    const bool acquired = acquire_event(&event);
    if (acquired && device_.record_event(event, stream) == Status::ok) {
      pending_.push_back({event, block});
      ++recorded;
      continue;
    }
    // No event to wait on: wait for the stream now, which is always correct.
    if (acquired) spare_events_.push_back(event);
    device_.synchronize_stream(stream);
  }
  block->pending_events = recorded;
  return recorded;
}

std::vector<Event> DeferredFrees::pending_events() const {
  std::vector<Event> events;
  events.reserve(pending_.size());
  for (const Pending& pending : pending_) events.push_back(pending.event);
  return events;
}

}  // namespace spillway
