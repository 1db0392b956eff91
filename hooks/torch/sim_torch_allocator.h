// On the simulated device spillway is torch's CPU allocator, so everything
// torch allocates shares the device budget with the chunks, as on a GPU.
// See Note [torch's CPU allocator on the sim device] in sim_torch_allocator.cc.
#pragma once

#include "allocator/caching/caching_allocator.h"

namespace spillway::torch_bridge {

// Makes `allocator` torch's CPU allocator (c10::SetAllocator, the highest
// priority), once per process; never uninstalled. Later calls do nothing.
void install_sim_torch_allocator(CachingAllocator& allocator);
bool sim_torch_allocator_installed();

// While alive, torch's CPU allocations on this thread bypass the simulated
// device and go to the allocator that was installed before spillway's: for
// spillway's own host-side work (host updates of the chunked optimizers,
// their host copies and temporaries), which a GPU run would do in host memory.
// Nests; frees need no scope (they go by address).
class HostWorkScope {
 public:
  HostWorkScope();
  ~HostWorkScope();
  HostWorkScope(const HostWorkScope&) = delete;
  HostWorkScope& operator=(const HostWorkScope&) = delete;
  static bool active();
};

}  // namespace spillway::torch_bridge
