// The C ABI (allocator/spillway.h) over the process-wide Runtime.
//
// Each function is a thin translation: C arguments to the allocator's types,
// Status to NULL plus a per-thread message. Nothing may unwind into the
// caller (PyTorch, ctypes), so each body catches everything.
//
// Note [Pinning the library]
// The process runtime is never destroyed (Note [The process runtime lives
// forever] in runtime.h), and the simulated device runs worker threads in this
// library's code. If a dlopen user dlclose()d the library, that code would be
// unmapped under them. So the first activation marks the library
// RTLD_NODELETE: dlclose becomes a no-op.
#include "allocator/spillway.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>

#include "allocator/caching/caching_allocator.h"
#include "allocator/config/log.h"
#include "allocator/runtime.h"

namespace {

using spillway::CachingAllocator;
using spillway::Runtime;
using spillway::Status;

thread_local std::string t_last_error;

void set_last_error(std::string message) noexcept {
  try {
    t_last_error = std::move(message);
  } catch (...) {
    t_last_error.clear();  // out of memory for the message itself
  }
}

void pin_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&spillway_malloc), &info) != 0 && info.dli_fname != nullptr)
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // handle kept on purpose
  });
}

// The allocator, activating the runtime on first use; null with this
// thread's last error set when activation failed.
CachingAllocator* allocator_for(const char* call) {
  Runtime& runtime = Runtime::process();
  if (CachingAllocator* active = runtime.active_allocator()) return active;
  pin_library();
  std::string error;
  CachingAllocator* allocator = runtime.allocator(&error);
  if (allocator == nullptr) set_last_error(std::string(call) + ": " + error);
  return allocator;
}

std::string describe_pointer(const void* ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", ptr);
  return text;
}

void report_exception(const char* call) noexcept {
  try {
    throw;
  } catch (const std::exception& e) {
    set_last_error(std::string(call) + ": internal error: " + e.what());
  } catch (...) {
    set_last_error(std::string(call) + ": internal error");
  }
}

}  // namespace

extern "C" {

void* spillway_malloc(size_t size, int device, void* stream) {
  try {
    CachingAllocator* allocator = allocator_for("spillway_malloc");
    if (allocator == nullptr) return nullptr;
    const int managed = Runtime::process().device_ordinal();
    if (device != managed) {
      set_last_error("spillway_malloc: device " + std::to_string(device) +
                     " is not managed by spillway, which manages device " +
                     std::to_string(managed) + " only");
      return nullptr;
    }
    void* ptr = nullptr;
    if (allocator->allocate(&ptr, size, spillway::Stream{stream}) != Status::ok) {
      set_last_error("spillway_malloc(" + std::to_string(size) +
                     " bytes): " + CachingAllocator::last_error());
      return nullptr;
    }
    return ptr;
  } catch (...) {
    report_exception("spillway_malloc");
    return nullptr;
  }
}

void spillway_free(void* ptr, size_t /*size*/, int /*device*/, void* /*stream*/) {
  if (ptr == nullptr) return;
  try {
    CachingAllocator* allocator = Runtime::process().active_allocator();
    std::string error;
    if (allocator == nullptr) {
      error = "spillway_free(" + describe_pointer(ptr) +
              "): spillway is not active, so the pointer is not from spillway_malloc";
    } else if (allocator->deallocate(ptr) != Status::ok) {
      error = "spillway_free(" + describe_pointer(ptr) + "): " + CachingAllocator::last_error();
    }
    if (!error.empty()) {
      SPILLWAY_LOG(warn, "{}", error);
      set_last_error(std::move(error));
    }
  } catch (...) {
    report_exception("spillway_free");
  }
}

void spillway_empty_cache(void) {
  try {
    if (CachingAllocator* allocator = Runtime::process().active_allocator())
      allocator->empty_cache();
  } catch (...) {
    report_exception("spillway_empty_cache");
  }
}

void spillway_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) return;
  try {
    CachingAllocator* allocator = allocator_for("spillway_record_stream");
    if (allocator == nullptr) return;
    if (allocator->record_stream(ptr, spillway::Stream{stream}) != Status::ok) {
      std::string error = "spillway_record_stream(" + describe_pointer(ptr) +
                          "): " + CachingAllocator::last_error();
      SPILLWAY_LOG(warn, "{}", error);
      set_last_error(std::move(error));
    }
  } catch (...) {
    report_exception("spillway_record_stream");
  }
}

int spillway_configure(const char* conf) {
  try {
    if (conf == nullptr) {
      set_last_error("spillway_configure: the configuration is NULL");
      return -1;
    }
    std::string error;
    if (!Runtime::process().configure(conf, &error)) {
      set_last_error("spillway_configure: " + error);
      return -1;
    }
    return 0;
  } catch (...) {
    report_exception("spillway_configure");
    return -1;
  }
}

size_t spillway_stats_json(char* buffer, size_t size) {
  try {
    if (buffer != nullptr && size > 0) buffer[0] = '\0';
    CachingAllocator* allocator = allocator_for("spillway_stats_json");
    if (allocator == nullptr) return 0;
    const std::string json = Runtime::process().stats().to_json();
    if (buffer != nullptr && size > 0) {
      const std::size_t copied = json.size() < size ? json.size() : size - 1;
      std::memcpy(buffer, json.data(), copied);
      buffer[copied] = '\0';
    }
    return json.size();
  } catch (...) {
    report_exception("spillway_stats_json");
    return 0;
  }
}

const char* spillway_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
