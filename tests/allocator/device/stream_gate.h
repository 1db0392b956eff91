// StreamGate: a host function that blocks its stream until the test opens
// it, so "the copy has not run yet" is a fact, not a race the test hopes to
// win. Used by the device conformance suite and the chunk mover's tests.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "allocator/device/device.h"

namespace spillway::testing {

// Blocks a stream at the point it was launched until open() is called.
class StreamGate {
 public:
  StreamGate(Device& device, Stream stream) {
    launched_ = device.launch_host_function(stream, &StreamGate::wait, this) == Status::ok;
    EXPECT_TRUE(launched_);
  }
  // Opens, and outlives the host function's last look at the gate.
  ~StreamGate() {
    open();
    while (launched_ && !passed_.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  void open() { open_.store(true, std::memory_order_release); }

 private:
  static void wait(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    while (!gate->open_.load(std::memory_order_acquire)) std::this_thread::yield();
    gate->passed_.store(true, std::memory_order_release);
  }
  bool launched_ = false;
  std::atomic<bool> open_{false};
  std::atomic<bool> passed_{false};
};

}  // namespace spillway::testing
