// Runtime: the objects one spillway activation wires together (device,
// caching allocator, chunk manager, trace recorder), built once from a
// configuration.
//
// Design summary:
//  - Core classes take collaborators as constructor arguments; only the C
//    ABI, the hooks and the tools reach the process-wide instance,
//    Runtime::process(). Tests build their own Runtime from a string.
//  - Activation happens once (std::call_once), on the first call that needs
//    the allocator, from the text given to configure() or else SPILLWAY_CONF.
//    Its outcome is sticky: after a failure every call fails with the same
//    message, which names the bad key. Nothing throws out of activation.
//  - After activation the hot path (allocator()) is one acquire load.
//  - Note [The process runtime lives forever]: Runtime::process() is never
//    destroyed. PyTorch frees tensors during interpreter shutdown, after
//    static destructors would have run; a destroyed allocator there would be
//    a use-after-free. An exit handler instead completes the trace file
//    (later events are dropped) and the library pins itself in memory
//    (RTLD_NODELETE) so a dlclose cannot unload code the device's threads run.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "allocator/caching/caching_allocator.h"
#include "allocator/chunk/chunk_manager.h"
#include "allocator/config/config.h"
#include "allocator/device/device.h"
#include "tracer/op_tracer.h"
#include "tracer/trace_recorder.h"

namespace spillway {

class Runtime {
 public:
  // A runtime that activates from SPILLWAY_CONF unless configure() comes
  // first.
  Runtime() = default;
  // A runtime that activates from `conf` (SPILLWAY_CONF is not read).
  explicit Runtime(std::string conf) : configured_text_(std::move(conf)) {}
  ~Runtime();

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process-wide runtime behind the C ABI and the hooks.
  static Runtime& process();

  // Sets the configuration text for activation. Fails (false, *error set)
  // when the text does not parse, or when already active with other text.
  bool configure(std::string_view conf, std::string* error);

  // Activates if needed. The allocator, or null with *error set when
  // activation failed.
  CachingAllocator* allocator(std::string* error) {
    if (CachingAllocator* active = allocator_.load(std::memory_order_acquire)) return active;
    return activate(error);
  }
  // The allocator when already active; null otherwise (never activates).
  CachingAllocator* active_allocator() const { return allocator_.load(std::memory_order_acquire); }

  // Valid once allocator() has returned non-null.
  const Config& config() const { return config_; }
  Device& device() const { return *device_; }
  // The device ordinal the runtime manages (see spillway.h).
  int device_ordinal() const { return 0; }
  // The process's one chunk manager, the allocator's pressure handler.
  ChunkManager& chunk_manager() const { return *chunk_manager_; }
  // Allocator and chunk-manager figures together, under the contract keys.
  Stats stats() const;
  // Null unless the `trace` option is set.
  TraceRecorder* trace_recorder() const { return recorder_.get(); }
  // Where the op hooks record op events; null unless the `trace` option is set.
  OpTracer* op_tracer() const { return op_tracer_.get(); }

  // Everything traced so far reaches the trace file. False (with *error) on a
  // write error; true when there is no trace.
  bool flush_trace(std::string* error);
  // Completes the trace file (end record); later events are dropped. Called
  // at exit for the process runtime.
  bool close_trace(std::string* error);

 private:
  CachingAllocator* activate(std::string* error);
  // Builds everything; false with activation_error_ set on failure.
  bool build();
  void warn_if_copies_take_seconds() const;

  std::mutex mutex_;  // guards configured_text_ and activation_started_
  std::optional<std::string> configured_text_;
  bool activation_started_ = false;
  std::once_flag once_;

  // Written once inside call_once, read after it.
  std::string active_text_;
  std::string activation_error_;
  Config config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<TraceRecorder> recorder_;
  std::unique_ptr<OpTracer> op_tracer_;  // on recorder_
  std::unique_ptr<CachingAllocator> owned_allocator_;
  std::unique_ptr<ChunkManager> chunk_manager_;  // after the allocator it draws on
  std::atomic<CachingAllocator*> allocator_{nullptr};
};

}  // namespace spillway
