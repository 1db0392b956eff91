// Runtime: one activation's device, allocator and trace recorder. See the
// design summary and Note [The process runtime lives forever] in runtime.h.
#include "allocator/runtime.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "allocator/config/log.h"
#include "allocator/make_device.h"
#include "allocator/policy/lru_policy.h"
#include "allocator/policy/planned_policy.h"

namespace spillway {

namespace {

constexpr const char* kConfEnvironmentVariable = "SPILLWAY_CONF";

// What a trace file says about the run that wrote it (docs/trace-format.md).
TraceMetadata trace_metadata(const Config& config, Device& device, std::size_t total_bytes,
                             std::size_t budget_bytes) {
  const auto unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return {
      {"writer", "spillway"},
      {"device", device.name()},
      {"device_kind", std::string(to_string(device.kind()))},
      {"device_total_bytes", std::to_string(total_bytes)},
      {"device_budget_bytes", std::to_string(budget_bytes)},
      {"chunk_size_bytes", std::to_string(config.chunk_size)},
      {"config", format_config(config)},
      {"pid", std::to_string(::getpid())},
      {"created_unix_ns", std::to_string(unix_ns)},
      {"clock", "Device::now_ns, monotonic nanoseconds"},
  };
}

std::unique_ptr<EvictionPolicy> make_eviction_policy(const Config& config) {
  switch (config.policy) {
    case EvictionPolicyKind::static_residency:
      return std::make_unique<NoEvictionPolicy>();
    case EvictionPolicyKind::planned:
      return std::make_unique<PlannedPolicy>(config.warmup_steps);
    case EvictionPolicyKind::lru:
      break;
  }
  return std::make_unique<LruPolicy>();
}

}  // namespace

Runtime::~Runtime() {
  // The chunk manager gives its chunks back to the allocator; the allocator
  // returns its slabs, which may still trace. Then the trace file is
  // completed, and the device goes last (a member, declared first).
  allocator_.store(nullptr, std::memory_order_release);
  chunk_manager_.reset();
  owned_allocator_.reset();
  if (recorder_ != nullptr) recorder_->close(device_->now_ns());
}

Runtime& Runtime::process() {
  // Leaked on purpose: Note [The process runtime lives forever].
  static Runtime* const runtime = [] {
    auto* created = new Runtime();
    std::atexit([] {
      std::string error;
      if (Runtime::process().close_trace(&error)) return;
      // The trace is lost: the exit status says so, whatever main returned
      // (a tool that lost its output must not exit 0).
      SPILLWAY_LOG(error, "completing the trace file at exit failed: {}", error);
      std::fflush(nullptr);
      std::_Exit(EXIT_FAILURE);
    });
    return created;
  }();
  return *runtime;
}

bool Runtime::configure(std::string_view conf, std::string* error) {
  const ConfigResult parsed = parse_config(conf);
  if (!parsed.ok()) {
    *error = parsed.error->message;
    return false;
  }
  std::lock_guard lock(mutex_);
  if (activation_started_) {
    const ConfigResult active = parse_config(active_text_);
    if (active.ok() && *active.config == *parsed.config) return true;
    *error = "spillway is already active (configured with \"" + active_text_ +
             "\"); the configuration is read once, before the first allocation";
    return false;
  }
  configured_text_ = std::string(conf);
  return true;
}

CachingAllocator* Runtime::activate(std::string* error) {
  std::call_once(once_, [this] {
    bool ok = false;
    try {
      ok = build();
    } catch (const std::exception& e) {
      activation_error_ = std::string("activation failed: ") + e.what();
    }
    if (ok) {
      allocator_.store(owned_allocator_.get(), std::memory_order_release);
    } else {
      // Nothing half-built stays around.
      owned_allocator_.reset();
      recorder_.reset();
      device_.reset();
    }
  });
  if (CachingAllocator* active = allocator_.load(std::memory_order_acquire)) return active;
  if (error) *error = activation_error_;
  return nullptr;
}

bool Runtime::build() {
  std::string source;
  {
    std::lock_guard lock(mutex_);
    activation_started_ = true;
    if (configured_text_) {
      active_text_ = *configured_text_;
      source = "spillway_configure";
    } else {
      const char* env = std::getenv(kConfEnvironmentVariable);
      active_text_ = env ? env : "";
      source = kConfEnvironmentVariable;
    }
  }
  const ConfigResult parsed = parse_config(active_text_);
  if (!parsed.ok()) {
    activation_error_ = "spillway is not active: invalid configuration from " + source + ": " +
                        parsed.error->message;
    SPILLWAY_LOG(error, "{}", activation_error_);
    return false;
  }
  config_ = *parsed.config;
  set_log_level(config_.log);

  std::string error;
  device_ = make_device(config_, &error);
  if (device_ == nullptr) {
    activation_error_ = "spillway is not active: " + error;
    SPILLWAY_LOG(error, "{}", activation_error_);
    return false;
  }
  MemoryInfo memory;
  if (const Status status = device_->memory_info(&memory); status != Status::ok) {
    activation_error_ = "spillway is not active: reading the memory size of " + device_->name() +
                        " failed: " + std::string(to_string(status)) + " " + device_->last_error();
    SPILLWAY_LOG(error, "{}", activation_error_);
    return false;
  }
  const std::size_t budget = config_.device_budget.resolve(memory.total_bytes);

  if (!config_.trace.empty()) {
    recorder_ = TraceRecorder::open(
        config_.trace, trace_metadata(config_, *device_, memory.total_bytes, budget), &error);
    if (recorder_ == nullptr) {
      activation_error_ = "spillway is not active: trace:" + config_.trace + ": " + error;
      SPILLWAY_LOG(error, "{}", activation_error_);
      return false;
    }
    op_tracer_ = std::make_unique<OpTracer>(*recorder_);
  }

  CachingAllocatorOptions options;
  options.budget_bytes = budget;
  options.large_slab_bytes = config_.chunk_size;
  options.expandable_segments = config_.expandable_segments;
  owned_allocator_ = std::make_unique<CachingAllocator>(*device_, options, recorder_.get());
  ChunkManagerOptions chunk_options = ChunkManagerOptions::from_config(config_);
  // sim_bandwidth models the simulated device's copies only; elsewhere the
  // copy bandwidth is unknown and prefetches are not timed.
  if (device_->kind() != DeviceKind::sim) chunk_options.copy_bytes_per_s = 0;
  warn_if_copies_take_seconds();
  chunk_manager_ = std::make_unique<ChunkManager>(*device_, *owned_allocator_, chunk_options,
                                                  make_eviction_policy(config_), recorder_.get());
  SPILLWAY_LOG(info, "active on {}: budget {} bytes, chunk size {} bytes{}{}", device_->name(),
               budget, config_.chunk_size, config_.trace.empty() ? "" : ", tracing to ",
               config_.trace);
  return true;
}

// A rate in the wrong unit (1MB/s for 1GB/s) is accepted, and every fetch
// then takes seconds: the run looks hung, not misconfigured.
void Runtime::warn_if_copies_take_seconds() const {
  if (device_->kind() != DeviceKind::sim || config_.sim_bandwidth == 0) return;
  const double chunk_copy_s =
      static_cast<double>(config_.chunk_size) / static_cast<double>(config_.sim_bandwidth);
  if (chunk_copy_s < 1.0) return;
  SPILLWAY_LOG(warn,
               "sim_bandwidth:{}B/s copies one chunk ({} bytes) in {:.3g} s, so each chunk "
               "fetch or write-back stalls the program that long; a device link moves GB/s "
               "(sim_bandwidth:25GB/s, say)",
               config_.sim_bandwidth, config_.chunk_size, chunk_copy_s);
}

Stats Runtime::stats() const {
  Stats stats = owned_allocator_->stats();
  chunk_manager_->stats().add_to(&stats);
  stats.min_budget_bytes = static_cast<std::int64_t>(chunk_manager_->min_budget_bytes());
  return stats;
}

bool Runtime::flush_trace(std::string* error) {
  if (active_allocator() == nullptr || recorder_ == nullptr) return true;
  if (recorder_->flush()) return true;
  if (error) *error = recorder_->error();
  return false;
}

bool Runtime::close_trace(std::string* error) {
  if (active_allocator() == nullptr || recorder_ == nullptr) return true;
  if (recorder_->close(device_->now_ns())) return true;
  if (error) *error = recorder_->error();
  return false;
}

}  // namespace spillway
