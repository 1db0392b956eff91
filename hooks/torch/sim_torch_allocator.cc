// spillway's caching allocator as torch's CPU allocator on the simulated
// device.
//
// Note [torch's CPU allocator on the sim device]
// On a GPU, everything a step allocates after .cuda() (activations,
// temporaries, a stock optimizer's state) comes from the CUDA allocator,
// which spillway replaces: it shares the device budget with the chunks, and a
// request that does not fit spills chunks first. The simulated device's
// tensors are CPU tensors, so on `device:sim` activation makes spillway torch's
// CPU allocator (c10::SetAllocator, priority 255: nothing installed later with
// a lower priority displaces it). From then on every torch CPU allocation is
// carved from the simulated device by the process's CachingAllocator, under
// device_budget:
//  - A request that does not fit asks the pressure handlers (the chunk manager
//    spills chunks not pinned by running ops); only when nothing evictable is
//    left does it fail, as torch's c10::OutOfMemoryError
//    (torch_out_of_memory.h). The op hooks release their chunks when the op
//    throws, so the allocator and the chunk manager stay consistent and the
//    program can go on with a smaller step.
//  - The object has static lifetime and is never uninstalled (torch frees
//    tensors during interpreter shutdown; Note [The process runtime lives
//    forever]).
//  - Frees go by address. allocate()'s DataPtr carries its own deleter: ours
//    for our blocks, the previous allocator's for memory it handed out (before
//    the install, or inside a HostWorkScope). raw_deallocate (oneDNN's
//    scratch memory) has no DataPtr: raw_deleter() asks the simulated device
//    whether the pointer lies in its memory, and hands any other pointer to the
//    previous allocator's raw deleter.
//  - spillway's own host-side work runs in a HostWorkScope (thread-local), where
//    torch's allocations go to the previous allocator: on a GPU it would use
//    host memory.
//  - A storage keeps the allocator it was made with: resize_ of a tensor made
//    before the install grows it through the previous allocator.
//  - Size 0 gives a null DataPtr, as torch's own CPU allocator does.
#include "hooks/torch/sim_torch_allocator.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "allocator/config/log.h"
#include "allocator/device/sim_device.h"
#include "hooks/torch/torch_allocator_compat.h"
#include "hooks/torch/torch_out_of_memory.h"

namespace spillway::torch_bridge {

namespace {

thread_local int t_host_work_depth = 0;

class SimTorchAllocator final : public CompatAllocator {
 public:
  SimTorchAllocator(CachingAllocator& allocator, c10::Allocator* previous)
      : allocator_(allocator),
        sim_device_(dynamic_cast<SimDevice*>(&allocator.device())),
        previous_(previous),
        previous_raw_deleter_(previous != nullptr ? previous->raw_deleter() : nullptr) {}

  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }

 private:
  c10::DataPtr do_allocate(std::size_t bytes) const override {
    if (t_host_work_depth > 0) return previous_->allocate(bytes);
    void* ptr = nullptr;
    const Status status = allocator_.allocate(&ptr, bytes, Stream{});
    if (status != Status::ok) throw_out_of_memory(bytes, status);
    return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CPU)};
  }

  static void delete_block(void* ptr);
  static void raw_delete(void* ptr);

  CachingAllocator& allocator_;
  SimDevice* const sim_device_;
  c10::Allocator* const previous_;
  const c10::DeleterFnPtr previous_raw_deleter_;
};

// Written once, before the install publishes it to torch.
std::atomic<SimTorchAllocator*> g_installed{nullptr};

// A deleter cannot throw, and a free that fails means the allocator's books
// and torch's disagree (a double free, a pointer never handed out): going on
// would hand out or leak memory that torch still thinks it owns.
[[noreturn]] void stop_on_bad_free(void* ptr, const std::string& why) {
  SPILLWAY_LOG(error, "freeing torch's block {}: {}. Stopping the process", ptr, why);
  std::fflush(stderr);
  std::abort();
}

void SimTorchAllocator::delete_block(void* ptr) {
  SimTorchAllocator* self = g_installed.load(std::memory_order_acquire);
  if (self->allocator_.deallocate(ptr) != Status::ok)
    stop_on_bad_free(ptr, CachingAllocator::last_error());
}

void SimTorchAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  SimTorchAllocator* self = g_installed.load(std::memory_order_acquire);
  if (self->sim_device_ != nullptr && self->sim_device_->is_device_pointer(ptr)) {
    delete_block(ptr);
  } else if (self->previous_raw_deleter_ != nullptr) {
    self->previous_raw_deleter_(ptr);
  } else {
    stop_on_bad_free(ptr,
                     "raw_deallocate of a pointer neither spillway's nor the previous "
                     "allocator's");
  }
}

}  // namespace

void install_sim_torch_allocator(CachingAllocator& allocator) {
  static std::once_flag once;
  std::call_once(once, [&allocator] {
    // Static lifetime: never destroyed (Note [torch's CPU allocator on the sim device]).
    static auto* const installed =
        new SimTorchAllocator(allocator, c10::GetAllocator(c10::DeviceType::CPU));
    g_installed.store(installed, std::memory_order_release);
    c10::SetAllocator(c10::DeviceType::CPU, installed, /*priority=*/255);
  });
}

bool sim_torch_allocator_installed() {
  return g_installed.load(std::memory_order_acquire) != nullptr;
}

HostWorkScope::HostWorkScope() { ++t_host_work_depth; }
HostWorkScope::~HostWorkScope() { --t_host_work_depth; }
bool HostWorkScope::active() { return t_host_work_depth > 0; }

}  // namespace spillway::torch_bridge
