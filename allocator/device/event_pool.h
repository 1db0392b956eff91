// EventPool: device events kept for reuse, so that marking an ordering point
// (a reuse fence, a slab's fence) records into an existing event instead of
// creating one each time. Not thread-safe: its owner calls it under its lock.
#pragma once

#include <cstddef>
#include <vector>

#include "allocator/device/device.h"

namespace spillway {

class EventPool {
 public:
  explicit EventPool(Device& device) : device_(device) {}
  ~EventPool() {
    for (Event event : spare_) device_.destroy_event(event);
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A spare event, or a new one; a null event when the device cannot make one.
  Event take() {
    Event event{};
    if (!spare_.empty()) {
      event = spare_.back();
      spare_.pop_back();
    } else if (device_.create_event(&event) != Status::ok) {
      event = Event{};
    }
    return event;
  }
  // An event nobody waits on any more; a later take() records it again.
  void give_back(Event event) { spare_.push_back(event); }
  std::size_t spare_count() const { return spare_.size(); }

 private:
  Device& device_;
  std::vector<Event> spare_;
};

}  // namespace spillway
