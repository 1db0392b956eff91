// PinCallingThread: pins the calling thread to one CPU for a scope, as
// OMP_PROC_BIND or taskset on a program's main thread would, so the optimizer
// tests can check that kernel pools still use the other cores.
#pragma once

#include <sched.h>

namespace spillway::optim::cpu {  // where the optimizer tests live

// Pins the calling thread to the first CPU it may use, as OMP_PROC_BIND or
// taskset on the main thread would; restores its mask when it goes.
class PinCallingThread {
 public:
  PinCallingThread() {
    CPU_ZERO(&saved_);
    sched_getaffinity(0, sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &saved_)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    pinned_ = sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~PinCallingThread() { sched_setaffinity(0, sizeof(saved_), &saved_); }
  PinCallingThread(const PinCallingThread&) = delete;
  PinCallingThread& operator=(const PinCallingThread&) = delete;
  bool pinned() const { return pinned_; }
  int cpus_before() const { return CPU_COUNT(&saved_); }

 private:
  cpu_set_t saved_;
  bool pinned_ = false;
};

}  // namespace spillway::optim::cpu
