// DeferredFrees: blocks freed by their caller but still in use on other
// streams (record_stream), each waiting for events recorded on those streams
// at free time. See Note [Deferred frees and streams] in caching_allocator.cc.
//
// Not thread-safe: the allocator calls it under its mutex. Events are
// recycled, never destroyed before the DeferredFrees is, so an Event copied
// out by pending_events() stays valid to synchronize on without the lock.
#pragma once

#include <cstddef>
#include <vector>

#include "allocator/caching/block.h"
#include "allocator/device/device.h"

namespace spillway {

class DeferredFrees {
 public:
  explicit DeferredFrees(Device& device);
  ~DeferredFrees();  // destroys the events; the caller has waited for them

  DeferredFrees(const DeferredFrees&) = delete;
  DeferredFrees& operator=(const DeferredFrees&) = delete;

  // Records an event on each stream in block->used_on_streams and sets
  // block->pending_events. Returns that count: 0 means nothing is pending
  // (a stream whose event could not be recorded is synchronized instead).
  int defer(Block* block);

  // Calls ready(block) for each block whose last event has completed.
  template <typename OnReady>
  void collect_completed(OnReady&& ready) {
    std::size_t kept = 0;
    for (Pending& pending : pending_) {
      if (device_.query_event(pending.event) == Status::not_ready) {
        pending_[kept++] = pending;
        continue;
      }
      // Complete (or unknown to the device, which can never complete).
      spare_events_.push_back(pending.event);
      if (--pending.block->pending_events == 0) ready(pending.block);
    }
    pending_.resize(kept);
  }

  bool empty() const { return pending_.empty(); }
  std::size_t size() const { return pending_.size(); }
  std::vector<Event> pending_events() const;

 private:
  struct Pending {
    Event event;
    Block* block;
  };

  bool acquire_event(Event* event);

  Device& device_;
  std::vector<Pending> pending_;
  std::vector<Event> spare_events_;
  std::vector<Event> all_events_;  // destroyed with this object
};

}  // namespace spillway
