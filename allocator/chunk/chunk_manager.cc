// ChunkManager: model data in chunks that move between the device and host
// memory, shared by every model and optimizer in the process.
//
// (Design summary: chunk_manager.h.) This file: the access protocol,
// residency (fetches, evictions, payloads) and pressure from the allocator.
//
// Note [Evicting under pressure]
// The allocator asks us (relieve_pressure) when a request on some stream S
// does not fit. We evict through the policy until enough capacity is freed;
// each eviction queues its write-back and deallocates at once (Note [Reuse
// fences]), so nothing blocks here.
// The freed blocks belong to the fetch stream, and S cannot take them as
// blocks; but each is a whole slab (chunk_size = large_slab_bytes, Note [A
// device copy is a whole slab]), so the allocator's retry returns those
// segments to the device and reserves one for S. Returning a segment (cudaFree, SimDevice::free)
// waits for all device work, our write-backs included, so the memory is idle when S gets it. Chunks
// of 1 MiB or less live in the allocator's small pool, two to a slab, and a freed one may not free
// a slab: use chunks above 1 MiB. When the allocator calls us from inside our own fetch (we asked
// it for a device copy and it ran out), we answer 0: the fetch evicts by itself, under the lock it
// already holds (AllocatingScope).
//
// Note [Waiting outside the lock]
// Host waits (WaitMode::host, acquire_host) happen after unlocking, so other
// threads keep acquiring. The chunk is pinned first (its users count), so
// the event waited for cannot be recorded again meanwhile: a chunk in use is
// neither evicted nor fetched. The exceptions, which block under the lock,
// are rare and need the moves finished before memory is given back:
// freeing a host copy (discard, remove_client, relayout) and synchronize().
//
// Note [Budget overruns]
// An op hooked into torch cannot be failed from the hook (torch's
// RecordFunction swallows a callback's exception), and it must not run on
// bytes that are not resident. So its acquires pass OverBudget::overrun: when
// every resident chunk is in compute and the chunk does not fit, it comes in
// past the chunk budget, and past the allocator's budget through a segment of
// its own (Note [Segments past the budget] in caching_allocator.cc). Each is
// counted (num_budget_overruns), traced (budget_overrun) and reported to the
// caller (last_overrun_bytes), which warns. The overrun is temporary: the
// release that leaves a chunk out of compute evicts until both budgets hold
// again (end_overrun_locked). Only a device with no physical room left fails
// such an acquire.
//
// Note [Host access to device copies]
// WaitMode::host is for code that touches the device copy from the host (the
// simulated device, where torch's CPU kernels run on device memory). The host
// is then one more stream: besides the fetch, it waits for the work released
// on every stream that used the chunk, as a write-back does, or it could read
// bytes that a queued kernel has yet to write. WaitMode::stream does not
// order the caller's stream after other streams' work on the chunk; as in
// PyTorch, handing a tensor between streams is the caller's to synchronize.
#include "allocator/chunk/chunk_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "allocator/chunk/chunk.h"
#include "allocator/chunk/chunk_packer.h"
#include "allocator/config/format_bytes.h"
#include "allocator/config/invariant.h"
#include "allocator/config/log.h"
#include "allocator/policy/lru_policy.h"

namespace spillway {
namespace {

thread_local std::string t_last_error;
// The manager whose fetch is inside CachingAllocator::allocate on this thread.
thread_local const ChunkManager* t_allocating_manager = nullptr;
// Note [Budget overruns]: what this thread's last acquire overran by.
thread_local std::size_t t_last_overrun_bytes = 0;

std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{16} << 30;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
}

// Whether the allocator surely has a block of `bytes` without evicting: room
// under its budget, or that many cached bytes (which may be fragments).
bool allocator_has_room(const CachingAllocator& allocator, std::size_t bytes) {
  const Stats stats = allocator.stats();
  const auto reserved = static_cast<std::size_t>(stats.reserved_bytes.current);
  const auto cached = reserved - static_cast<std::size_t>(stats.active_bytes.current);
  const std::size_t budget = allocator.budget_bytes();
  const std::size_t headroom = budget > reserved ? budget - reserved : 0;
  return headroom >= bytes || cached >= bytes;
}

}  // namespace

ChunkManagerOptions ChunkManagerOptions::from_config(const Config& config) {
  ChunkManagerOptions options;
  options.chunk_size = config.chunk_size;
  options.host_budget_bytes = config.host_budget.resolve(physical_memory_bytes());
  options.strict_residency = config.strict_residency;
  options.planned_prefetch = config.prefetch;
  options.copy_bytes_per_s = config.sim_bandwidth;
  return options;
}

// The allocator may call relieve_pressure and describe_holdings on this
// thread while our fetch is inside allocate, with our lock held (Note
// [Evicting under pressure]); this marks that window.
class ChunkManager::AllocatingScope {
 public:
  explicit AllocatingScope(const ChunkManager* manager) : previous_(t_allocating_manager) {
    t_allocating_manager = manager;
  }
  ~AllocatingScope() { t_allocating_manager = previous_; }

 private:
  const ChunkManager* previous_;
};

class ChunkManager::Candidates final : public EvictionCandidates {
 public:
  explicit Candidates(const ChunkManager& manager) : manager_(manager) {}
  bool evictable(ChunkId id) const override {
    const Chunk* chunk = manager_.find_chunk_locked(id);
    return chunk != nullptr && chunk->resident() && !chunk->in_use();
  }

 private:
  const ChunkManager& manager_;
};

// Note [Prefetch timed by op durations] (allocator/policy/prefetch_timing.h).
class ChunkManager::FetchClock final : public CopyClock {
 public:
  explicit FetchClock(const ChunkManager& manager) : manager_(manager) {}
  std::uint64_t now_ns() const override { return manager_.policy_clock_ns_locked(); }
  std::uint64_t stream_free_at_ns(ChunkId id) const override {
    if (!queues_on_fetch_stream(id)) return now_ns();
    return manager_.policy_time_locked(manager_.fetch_stream_free_at_ns_);
  }
  bool queues_on_fetch_stream(ChunkId id) const override {
    const Chunk* chunk = manager_.find_chunk_locked(id);
    return chunk == nullptr || chunk->location() != Location::none;
  }
  bool copies_modelled() const override { return manager_.options_.copy_bytes_per_s > 0; }
  std::optional<std::uint64_t> fetch_ns(ChunkId id) const override {
    const Chunk* chunk = manager_.find_chunk_locked(id);
    if (chunk == nullptr) return std::nullopt;
    return manager_.fetch_ns_locked(*chunk);
  }
  // The device's reserve left once the chunk is in (taken from a cached
  // block where one is free), in whole small slabs: an activation that finds
  // no cached block fitting takes a new slab, and cached blocks are often
  // fragments (Note [Room a prefetch takes early]).
  std::uint64_t room_bytes(ChunkId id) const override {
    const Chunk* chunk = manager_.find_chunk_locked(id);
    if (chunk == nullptr) return 0;
    const Stats stats = manager_.allocator_.stats();
    const auto reserved = static_cast<std::uint64_t>(stats.reserved_bytes.current);
    const auto active = static_cast<std::uint64_t>(stats.active_bytes.current);
    const std::uint64_t taken = std::max(reserved, active + manager_.device_copy_bytes(*chunk));
    const std::uint64_t budget = manager_.allocator_.budget_bytes();
    const std::uint64_t left = budget > taken ? budget - taken : 0;
    return left / CachingAllocator::kSmallSlabBytes * CachingAllocator::kSmallSlabBytes;
  }
  std::uint64_t non_model_bytes() const override {
    return static_cast<std::uint64_t>(
        manager_.allocator_.stats().allocated_bytes_non_model.current);
  }
  // As allocate_device_copy_locked and make_room_locked judge it.
  bool fits_without_eviction(ChunkId id) const override {
    const Chunk* chunk = manager_.find_chunk_locked(id);
    if (chunk == nullptr) return false;
    const std::size_t bytes = manager_.device_copy_bytes(*chunk);
    if (manager_.resident_bytes_ + bytes > manager_.device_budget_bytes_) return false;
    return allocator_has_room(manager_.allocator_, bytes);
  }

 private:
  const ChunkManager& manager_;
};

ChunkManager::ChunkManager(Device& device, CachingAllocator& allocator, ChunkManagerOptions options,
                           std::unique_ptr<EvictionPolicy> policy, TraceSink* trace)
    : device_(device),
      allocator_(allocator),
      options_(options),
      host_pool_(device, options.host_budget_bytes),
      mover_(device),
      policy_(policy ? std::move(policy) : std::make_unique<LruPolicy>()),
      device_budget_bytes_(options.device_budget_bytes),
      trace_(trace) {
  allocator_.add_pressure_handler(this);
}

ChunkManager::~ChunkManager() {
  allocator_.remove_pressure_handler(this);
  std::lock_guard lock(mutex_);
  observers_.clear();  // they may be gone already; nobody binds to us any more
  for (auto& chunk : chunks_) {
    if (chunk) free_chunk_locked(*chunk);
  }
  // mover_ then waits for its streams and destroys them.
}

// --- Access protocol -----------------------------------------------------

Status ChunkManager::acquire(TensorId id, Stream stream, void** device_ptr, AccessMode access,
                             WaitMode wait, OverBudget over_budget) {
  *device_ptr = nullptr;
  t_last_overrun_bytes = 0;
  std::vector<Event> host_waits;  // WaitMode::host only
  {
    std::lock_guard lock(mutex_);
    TensorRecord* tensor = find_tensor_locked(id);
    if (tensor == nullptr) return unknown_tensor("acquire", id);
    Chunk& chunk = *find_chunk_locked(tensor->chunk);
    if (chunk.host_users != 0) {
      return fail(Status::invalid_argument,
                  fmt::format("acquire of {}: its {} is acquired on the host; a chunk is used on "
                              "one side at a time (release_host first)",
                              tensor_label_locked(*tensor), chunk_label_locked(chunk)));
    }
    if (!chunk.resident()) {
      if (Status status = fetch_locked(chunk, FetchReason::use, tensor, over_budget);
          status != Status::ok) {
        return status;
      }
    }
    SPILLWAY_INVARIANT(chunk.resident(), "an acquire hands out only resident bytes");
    note_access_context_locked(access);
    policy_->on_access(chunk.id);
    if (tensor->device_users++ == 0) {
      if (tensor->state == TensorState::hold) --chunk.held_tensors;
      tensor->state = TensorState::compute;
    }
    ++chunk.device_users;
    if (access == AccessMode::read_write) chunk.host_current = false;
    // After its fetch, if any, before the prefetches it starts (Note [Op
    // events] in tracer/op_tracer.h).
    trace_chunk_locked(TraceEventKind::chunk_access, chunk, static_cast<std::uint64_t>(id),
                       access == AccessMode::read_write ? kTraceDetailReadWrite : kTraceDetailRead);
    // After the access is counted, so the plan is at the next one, and after
    // the chunk is in use, so no prefetch evicts it.
    prefetch_planned_locked();
    write_back_ahead_locked();
    if (wait == WaitMode::stream) {
      mover_.order_after_fetch(chunk.moves, stream);
      if (access == AccessMode::read_write)
        mover_.order_write_after_write_back(chunk.moves, stream);
    } else {
      host_waits =
          mover_.waits_before_host_uses_device(chunk.moves, access == AccessMode::read_write);
    }
    *device_ptr = static_cast<char*>(chunk.device_data) + tensor->offset;
  }
  if (!host_waits.empty()) {
    // Note [Waiting outside the lock]
    const std::uint64_t start = device_.now_ns();
    for (Event event : host_waits) device_.synchronize_event(event);
    const auto stalled = static_cast<std::int64_t>(device_.now_ns() - start);
    std::lock_guard lock(mutex_);
    TensorRecord* tensor = find_tensor_locked(id);
    Chunk& chunk = *find_chunk_locked(tensor->chunk);
    mover_.note_host_waited(chunk.moves, host_waits);
    note_stall_locked(chunk, stalled);
  }
  return Status::ok;
}

Status ChunkManager::release(TensorId id, Stream stream) {
  std::lock_guard lock(mutex_);
  TensorRecord* tensor = find_tensor_locked(id);
  if (tensor == nullptr) return unknown_tensor("release", id);
  if (tensor->device_users == 0) {
    return fail(Status::invalid_argument,
                fmt::format("release of {}, which is not acquired on the device",
                            tensor_label_locked(*tensor)));
  }
  Chunk& chunk = *find_chunk_locked(tensor->chunk);
  mover_.record_release(chunk.moves, stream);
  --chunk.device_users;
  trace_chunk_locked(TraceEventKind::chunk_release, chunk, static_cast<std::uint64_t>(id));
  if (--tensor->device_users == 0 && tensor->host_users == 0) {
    tensor->state = TensorState::hold;
    ++chunk.held_tensors;
  }
  if (overrun_outstanding_ && chunk.device_users == 0) end_overrun_locked();
  if (chunk.device_users == 0) {  // it may be the victim now
    prefetch_planned_locked();
    write_back_ahead_locked();
  }
  return Status::ok;
}

Status ChunkManager::acquire_host(TensorId id, void** host_ptr, AccessMode access) {
  *host_ptr = nullptr;
  std::vector<Event> waits;
  {
    std::lock_guard lock(mutex_);
    TensorRecord* tensor = find_tensor_locked(id);
    if (tensor == nullptr) return unknown_tensor("acquire_host", id);
    Chunk& chunk = *find_chunk_locked(tensor->chunk);
    if (chunk.device_users != 0) {
      return fail(Status::invalid_argument,
                  fmt::format("acquire_host of {}: its {} is acquired on the device; a chunk is "
                              "used on one side at a time (release it first)",
                              tensor_label_locked(*tensor), chunk_label_locked(chunk)));
    }
    if (chunk.location() == Location::none) {
      if (Status status = materialize_locked(chunk); status != Status::ok) return status;
    } else if (chunk.dirty()) {
      if (Status status = write_back_locked(chunk); status != Status::ok) return status;
    }
    waits = mover_.waits_before_host_touches_host(chunk.moves, access == AccessMode::read_write);
    if (access == AccessMode::read_write && chunk.resident()) {
      drop_device_copy_locked(chunk);  // it would be stale
      notify_locked(chunk);
    }
    note_access_context_locked(access);
    policy_->on_host_access(chunk.id);
    if (tensor->host_users++ == 0 && tensor->device_users == 0) {
      if (tensor->state == TensorState::hold) --chunk.held_tensors;
      tensor->state = TensorState::compute;
    }
    ++chunk.host_users;
    *host_ptr = static_cast<char*>(chunk.host.data) + tensor->offset;
  }
  if (!waits.empty()) {
    // Note [Waiting outside the lock]
    const std::uint64_t start = device_.now_ns();
    for (Event event : waits) device_.synchronize_event(event);
    const auto stalled = static_cast<std::int64_t>(device_.now_ns() - start);
    std::lock_guard lock(mutex_);
    Chunk& chunk = *find_chunk_locked(find_tensor_locked(id)->chunk);
    mover_.note_host_waited(chunk.moves, waits);
    note_stall_locked(chunk, stalled);
  }
  return Status::ok;
}

Status ChunkManager::release_host(TensorId id) {
  std::lock_guard lock(mutex_);
  TensorRecord* tensor = find_tensor_locked(id);
  if (tensor == nullptr) return unknown_tensor("release_host", id);
  if (tensor->host_users == 0) {
    return fail(Status::invalid_argument,
                fmt::format("release_host of {}, which is not acquired on the host",
                            tensor_label_locked(*tensor)));
  }
  Chunk& chunk = *find_chunk_locked(tensor->chunk);
  --chunk.host_users;
  if (--tensor->host_users == 0 && tensor->device_users == 0) {
    tensor->state = TensorState::hold;
    ++chunk.held_tensors;
  }
  return Status::ok;
}

Status ChunkManager::prefetch(TensorId id) {
  std::lock_guard lock(mutex_);
  TensorRecord* tensor = find_tensor_locked(id);
  if (tensor == nullptr) return unknown_tensor("prefetch", id);
  Chunk& chunk = *find_chunk_locked(tensor->chunk);
  if (chunk.resident() || chunk.host_users != 0) return Status::ok;
  return fetch_locked(chunk, FetchReason::prefetch, tensor);
}

Status ChunkManager::discard(TensorId id) {
  std::lock_guard lock(mutex_);
  TensorRecord* tensor = find_tensor_locked(id);
  if (tensor == nullptr) return unknown_tensor("discard", id);
  if (tensor->state == TensorState::compute) {
    return fail(Status::invalid_argument,
                fmt::format("discard of {}, which is acquired", tensor_label_locked(*tensor)));
  }
  // Discarded again (the bridge looks for dead gradients at several points
  // of a step): its bytes died already, and dropping a chunk zeroed since
  // would only make its use zero it again, while the host waits.
  if (tensor->state == TensorState::free) return Status::ok;
  Chunk& chunk = *find_chunk_locked(tensor->chunk);
  if (tensor->state == TensorState::hold) --chunk.held_tensors;
  tensor->state = TensorState::free;
  if (chunk.state() == TensorState::free && chunk.location() != Location::none) {
    release_payloads_locked(chunk);
    notify_locked(chunk);
  }
  return Status::ok;
}

Status ChunkManager::evict(ChunkId id) {
  std::lock_guard lock(mutex_);
  Chunk* chunk = find_chunk_locked(id);
  if (chunk == nullptr) {
    return fail(Status::invalid_argument,
                fmt::format("evict of chunk {}, which does not exist", static_cast<unsigned>(id)));
  }
  if (!chunk->resident()) return Status::ok;
  if (chunk->in_use()) {
    return fail(Status::invalid_argument,
                fmt::format("evict of {}, which is in compute", chunk_label_locked(*chunk)));
  }
  return evict_locked(*chunk);
}

void ChunkManager::synchronize() {
  std::lock_guard lock(mutex_);
  mover_.synchronize();
  for (auto& chunk : chunks_) {
    if (chunk) mover_.note_moves_done(chunk->moves);
  }
}

void ChunkManager::set_device_budget_bytes(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  device_budget_bytes_ = bytes;
  while (resident_bytes_ > device_budget_bytes_ && evict_one_locked()) {
  }
}

std::size_t ChunkManager::device_budget_bytes() const {
  std::lock_guard lock(mutex_);
  return device_budget_bytes_;
}

// --- Moves ---------------------------------------------------------------

// Note [Budget overruns]. One acquire may overrun both budgets; it counts once.
void ChunkManager::note_overrun_locked(const Chunk& chunk, std::size_t over_bytes) {
  if (t_last_overrun_bytes == 0) {
    count_locked(chunk, [](ChunkStats& s) { ++s.budget_overruns; });
    trace_chunk_locked(TraceEventKind::budget_overrun, chunk, over_bytes);
  }
  t_last_overrun_bytes = std::max({t_last_overrun_bytes, over_bytes, std::size_t{1}});
  overrun_outstanding_ = true;
}

void ChunkManager::end_overrun_locked() {
  while (resident_bytes_ > device_budget_bytes_ && evict_one_locked()) {
  }
  auto allocator_over_budget = [this] {
    return static_cast<std::size_t>(allocator_.stats().reserved_bytes.current) >
           allocator_.budget_bytes();
  };
  while (allocator_over_budget() && evict_one_locked()) {
  }
  overrun_outstanding_ = resident_bytes_ > device_budget_bytes_ || allocator_over_budget();
}

// The smaller of our cap and the allocator's whole budget: no chunk larger
// than this can ever be on the device.
std::size_t ChunkManager::effective_budget_locked() const {
  return std::min(device_budget_bytes_, allocator_.budget_bytes());
}

// Note [A chunk without bytes is zeroed on the device]
// A chunk with bytes nowhere (never written, or every tensor in it
// discarded) reads as zeros. Its fetch sets the device copy to zero (on a
// stream of its own: Note [Two copy streams] in chunk_mover.cc) instead of
// copying a zeroed host copy over the link: it moves no bytes
// (bytes_moved_h2d and its chunk_fetch's size are 0; the copy model gives it
// no place in the fetch queue, and times it as a copy: fetch_ns_locked), and
// no host copy is made until an eviction writes the device copy back.
// Gradients set to none are discarded (Note [A gradient set to none is not
// fetched] in hooks/torch/dead_gradients.cc), so a backward after a
// set-to-none zero_grad fills its grad chunks this way instead of fetching
// the last step's gradients only to overwrite them.
Status ChunkManager::fetch_locked(Chunk& chunk, FetchReason reason, const TensorRecord* wanted_by,
                                  OverBudget over_budget) {
  const bool is_prefetch = reason != FetchReason::use;
  const std::size_t budget = effective_budget_locked();
  if (device_copy_bytes(chunk) > budget && over_budget == OverBudget::fail) {
    if (reason == FetchReason::planned_prefetch) return Status::out_of_memory;  // its use will say
    return fail(
        Status::out_of_memory,
        fmt::format("{} of {}: its {} needs {} on the device, more than the whole {} "
                    "budget of {}",
                    is_prefetch ? "prefetch" : "acquire", tensor_label_locked(*wanted_by),
                    chunk_label_locked(chunk), format_bytes(device_copy_bytes(chunk)),
                    budget == device_budget_bytes_ ? "chunk" : "device", format_bytes(budget)));
  }
  if (Status status = make_room_locked(chunk, reason, wanted_by, over_budget);
      status != Status::ok) {
    return status;
  }
  void* data = nullptr;
  if (Status status = allocate_device_copy_locked(chunk, reason, wanted_by, over_budget, &data);
      status != Status::ok) {
    return status;
  }
  // Note [A chunk without bytes is zeroed on the device]
  const bool zero_fill = chunk.location() == Location::none;
  const Status moved =
      zero_fill ? mover_.zero_fill(chunk.moves, data, device_copy_bytes(chunk), chunk.used_bytes)
                : mover_.fetch(chunk.moves, data, device_copy_bytes(chunk), chunk.host.data,
                               chunk.used_bytes);
  if (moved != Status::ok) {
    allocator_.deallocate(data);
    return fail(
        moved, fmt::format("fetch of {}: {}", chunk_label_locked(chunk), ChunkMover::last_error()));
  }
  const std::size_t copied_bytes = zero_fill ? 0 : chunk.used_bytes;
  if (zero_fill) chunk.sealed = true;  // Note [Sealed chunks] in chunk_layout.cc
  // Note [Two copy streams] (chunk_mover.cc): a zero fill does not queue.
  const std::uint64_t arrives_in_ns = zero_fill ? fetch_ns_locked(chunk).value_or(0)
                                                : note_fetch_queued_locked(chunk, device_.now_ns());
  // A fetch on use stalls its access until it arrives (the copy model's view).
  if (reason == FetchReason::use) note_expected_stall_locked(chunk, arrives_in_ns);
  chunk.device_data = data;
  chunk.device_current = true;
  resident_bytes_ += device_copy_bytes(chunk);
  policy_->on_resident(chunk.id);
  count_locked(chunk, [&](ChunkStats& s) {
    s.chunk_bytes_device += static_cast<std::int64_t>(device_copy_bytes(chunk));
    s.bytes_moved_h2d += static_cast<std::int64_t>(copied_bytes);
    ++s.fetches;
    if (is_prefetch) ++s.prefetches;
  });
  trace_chunk_locked(TraceEventKind::chunk_fetch, chunk, copied_bytes,
                     is_prefetch ? kTraceDetailPrefetch : 0);
  notify_locked(chunk);
  return Status::ok;
}

// Evicts until `incoming` fits in the chunk budget.
Status ChunkManager::make_room_locked(Chunk& incoming, FetchReason reason,
                                      const TensorRecord* wanted_by, OverBudget over_budget) {
  const Chunk* planned = reason == FetchReason::planned_prefetch ? &incoming : nullptr;
  while (resident_bytes_ + device_copy_bytes(incoming) > device_budget_bytes_) {
    if (evict_one_locked(planned)) continue;
    if (reason != FetchReason::use) return Status::out_of_memory;  // advice only: keep quiet
    if (over_budget == OverBudget::overrun) {
      note_overrun_locked(incoming,
                          resident_bytes_ + device_copy_bytes(incoming) - device_budget_bytes_);
      return Status::ok;
    }
    return fail(
        Status::out_of_memory,
        fmt::format("acquire of {}: no room for its {} ({}) in the chunk budget of {}: "
                    "{} of chunks is on the device and none can be evicted. {}",
                    tensor_label_locked(*wanted_by), chunk_label_locked(incoming),
                    format_bytes(device_copy_bytes(incoming)), format_bytes(device_budget_bytes_),
                    format_bytes(resident_bytes_), describe_in_use_locked()));
  }
  return Status::ok;
}

// Note [A device copy is a whole slab]
// A chunk's capacity is what its tensors need (Note [Packing tensors]), but
// its device copy is a whole slab of the allocator (chunk_size), or a
// segment of its own for a chunk larger than that. Evicting it then frees a
// whole segment, which Note [Evicting under pressure] relies on: a block
// split from a slab that another chunk shares frees nothing an activation on
// another stream can use. So below chunk_size the capacity saves host memory
// (host copies are of the capacity), but not device memory: that needs a
// segment of the chunk's own size from the allocator.
std::size_t ChunkManager::device_copy_bytes(const Chunk& chunk) const {
  return std::max(chunk.capacity, ChunkPacker(options_.chunk_size).chunk_capacity());
}

// A device copy from the allocator; when it is out of memory, evict and try
// again (Note [Evicting under pressure]).
Status ChunkManager::allocate_device_copy_locked(Chunk& chunk, FetchReason reason,
                                                 const TensorRecord* wanted_by,
                                                 OverBudget over_budget, void** data) {
  const Chunk* planned = reason == FetchReason::planned_prefetch ? &chunk : nullptr;
  const std::size_t bytes = device_copy_bytes(chunk);
  for (;;) {
    // Evicting first when the allocator surely has no room spares it an
    // out-of-memory (its counters and trace would show one per fetch).
    if (!allocator_has_room(allocator_, bytes) && evict_one_locked(planned)) continue;

    Status status;
    {
      AllocatingScope scope(this);
      status = allocator_.allocate(data, bytes, mover_.fetch_stream(), AllocationOwner::model);
    }
    if (status == Status::ok) return Status::ok;
    std::string allocator_error = CachingAllocator::last_error();
    if (status == Status::out_of_memory && evict_one_locked(planned)) continue;
    if (reason != FetchReason::use && status == Status::out_of_memory) return status;
    if (status == Status::out_of_memory && over_budget == OverBudget::overrun) {
      {
        AllocatingScope scope(this);
        status = allocator_.allocate_over_budget(data, bytes, mover_.fetch_stream());
      }
      if (status == Status::ok) {
        const auto reserved = static_cast<std::size_t>(allocator_.stats().reserved_bytes.current);
        const std::size_t allocator_budget = allocator_.budget_bytes();
        note_overrun_locked(chunk, reserved > allocator_budget ? reserved - allocator_budget : 0);
        return Status::ok;
      }
      allocator_error = CachingAllocator::last_error();
    }
    return fail(status,
                fmt::format("acquire of {}: the allocator has no room for its {} ({}) and no "
                            "chunk can be evicted. {} The allocator said: {}",
                            tensor_label_locked(*wanted_by), chunk_label_locked(chunk),
                            format_bytes(device_copy_bytes(chunk)), describe_in_use_locked(),
                            allocator_error));
  }
}

// Planned prefetches started per access: enough to keep a copy queued behind
// the one in flight; bounded so an access does little work under the lock.
constexpr int kMaxPlannedPrefetchesPerAccess = 4;

// Note [Planned prefetch] (planned_policy.h). Stops at the first chunk that
// cannot come in yet: the plan fetches in order of use.
void ChunkManager::prefetch_planned_locked() {
  if (!options_.planned_prefetch) return;
  for (int started = 0; started < kMaxPlannedPrefetchesPerAccess; ++started) {
    // Note [Prefetch timed by op durations]: nullopt also while it can wait.
    const std::optional<PlannedFetch> next = policy_->timed_prefetch(FetchClock(*this));
    if (!next) return;
    Chunk* chunk = find_chunk_locked(next->chunk);
    if (chunk == nullptr || chunk->resident() || chunk->host_users != 0) return;
    if (fetch_locked(*chunk, FetchReason::planned_prefetch, nullptr) != Status::ok) return;
    note_expected_stall_locked(*chunk, next->expected_stall_ns);
  }
}

// Note [Write-backs ahead of spills] (planned_policy.h): one at a time, so a
// spill's own write-back never queues behind more than one.
void ChunkManager::write_back_ahead_locked() {
  if (!options_.planned_prefetch) return;
  if (Chunk* previous = find_chunk_locked(writing_back_ahead_);
      previous != nullptr && !mover_.write_back_done(previous->moves)) {
    return;
  }
  for (const ChunkId id : policy_->spill_victims_ahead(Candidates(*this))) {
    Chunk* chunk = find_chunk_locked(id);
    if (chunk == nullptr || !chunk->dirty() || chunk->in_use()) continue;
    // A failure leaves the chunk dirty: its eviction writes it back, or says why not.
    if (write_back_locked(*chunk) != Status::ok) return;
    writing_back_ahead_ = id;
    return;
  }
}

// Note [Prefetch timed by op durations]: the host's waits for moves are not
// op time, or a traced step's stalls would make its ops look long enough to
// hide the next step's fetches; the policy's clock stops while the host waits,
// for a fetch or for the write-backs of a spill (Note [Time spent giving
// memory back] in caching_allocator.cc).
std::uint64_t ChunkManager::policy_clock_ns_locked() const {
  return policy_time_locked(device_.now_ns());
}

// What the policy records with an access: Notes [Prefetch timed by op
// durations] and [Room a prefetch takes early] (planned_policy.h).
void ChunkManager::note_access_context_locked(AccessMode access) {
  policy_->note_time(policy_clock_ns_locked());
  policy_->note_access_writes(access == AccessMode::read_write);
  policy_->note_non_model_high_water(allocator_.take_non_model_high_water());
}

std::uint64_t ChunkManager::policy_time_locked(std::uint64_t device_ns) const {
  const std::uint64_t waited =
      static_cast<std::uint64_t>(stats_.stall_ns) + allocator_.release_wait_ns();
  return device_ns > waited ? device_ns - waited : 0;
}

std::optional<std::uint64_t> ChunkManager::fetch_ns_locked(const Chunk& chunk) const {
  if (options_.copy_bytes_per_s <= 0) return std::nullopt;
  // A zero fill (Note [A chunk without bytes is zeroed on the device]) is
  // timed as a copy of its bytes too: the device's fill rate is unknown, a
  // GPU's beats the link by far (the lead is then a few microseconds too
  // long), and the simulated device's, page faults and a thread's wake-up
  // included, came near it: 2 MiB took 1 to 1.5 ms. Timed as free, each
  // fill started just before its use, and the demo's GPT stalled 6 ms a
  // step on them (docs/benchmarks.md, bench_train).
  return static_cast<std::uint64_t>(static_cast<double>(chunk.used_bytes) * 1e9 /
                                    options_.copy_bytes_per_s);
}

std::uint64_t ChunkManager::note_fetch_queued_locked(const Chunk& chunk, std::uint64_t now_ns) {
  const std::optional<std::uint64_t> copy_ns = fetch_ns_locked(chunk);
  if (!copy_ns) return 0;
  fetch_stream_free_at_ns_ = std::max(fetch_stream_free_at_ns_, now_ns) + *copy_ns;
  return fetch_stream_free_at_ns_ - now_ns;
}

void ChunkManager::note_expected_stall_locked(const Chunk& chunk, std::uint64_t expected_ns) {
  if (expected_ns == 0) return;
  const auto expected = static_cast<std::int64_t>(expected_ns);
  count_locked(chunk, [&](ChunkStats& s) { s.stall_expected_ns += expected; });
  step_stall_expected_ns_ += expected;
}

bool ChunkManager::evict_one_locked(const Chunk* planned_incoming) {
  const std::optional<ChunkId> victim =
      planned_incoming == nullptr
          ? policy_->choose_victim(Candidates(*this))
          : policy_->choose_victim_for_prefetch(Candidates(*this), planned_incoming->id);
  if (!victim) return false;
  Chunk* chunk = find_chunk_locked(*victim);
  if (chunk == nullptr || !chunk->resident() || chunk->in_use()) return false;  // a policy bug
  return evict_locked(*chunk) == Status::ok;
}

Status ChunkManager::evict_locked(Chunk& chunk) {
  SPILLWAY_INVARIANT(!chunk.in_use(), "a chunk in compute is never evicted");
  if (chunk.dirty()) {
    if (Status status = write_back_locked(chunk); status != Status::ok) return status;
  }
  SPILLWAY_INVARIANT(!chunk.dirty(), "an evicted chunk's bytes are current on the host");
  drop_device_copy_locked(chunk, kTraceDetailEviction);
  count_locked(chunk, [](ChunkStats& s) { ++s.evictions; });
  notify_locked(chunk);
  return Status::ok;
}

// Queues the device-to-host copy of a dirty chunk; the host copy is current
// once written_back completes.
Status ChunkManager::write_back_locked(Chunk& chunk) {
  if (Status status = ensure_host_copy_allocated_locked(chunk); status != Status::ok) {
    return status;
  }
  if (Status status =
          mover_.write_back(chunk.moves, chunk.host.data, chunk.device_data, chunk.used_bytes);
      status != Status::ok) {
    return fail(status, fmt::format("write-back of {}: {}", chunk_label_locked(chunk),
                                    ChunkMover::last_error()));
  }
  chunk.host_current = true;
  count_locked(chunk, [&](ChunkStats& s) {
    s.bytes_moved_d2h += static_cast<std::int64_t>(chunk.used_bytes);
    ++s.writebacks;
  });
  trace_chunk_locked(TraceEventKind::chunk_writeback, chunk, chunk.used_bytes);
  return Status::ok;
}

// Gives the device copy back to the allocator, fenced after its users
// (Note [Reuse fences] in chunk_mover.cc). The bytes must be current on the host (or not matter).
void ChunkManager::drop_device_copy_locked(Chunk& chunk, std::uint16_t trace_detail) {
  SPILLWAY_INVARIANT(chunk.device_users == 0, "a device copy in use is never given back");
  SPILLWAY_INVARIANT(resident_bytes_ >= device_copy_bytes(chunk),
                     "resident bytes count every device copy");
  // Note [Fenced slabs] in caching_allocator.cc: the allocator's release of
  // the memory waits for nothing when the copy is idle, else for the fence
  // below, which joins its fetch, users and write-back on the fence stream.
  const bool idle = mover_.device_copy_idle(chunk.moves);
  mover_.fence_reuse(chunk.moves, chunk.device_data, device_copy_bytes(chunk));
  if (idle) {
    allocator_.deallocate_idle(chunk.device_data);
  } else {
    allocator_.deallocate_after(chunk.device_data, mover_.fence_stream());
  }
  chunk.device_data = nullptr;
  chunk.device_current = false;
  resident_bytes_ -= device_copy_bytes(chunk);
  policy_->on_evicted(chunk.id);
  count_locked(chunk, [&](ChunkStats& s) {
    s.chunk_bytes_device -= static_cast<std::int64_t>(device_copy_bytes(chunk));
  });
  trace_chunk_locked(TraceEventKind::chunk_drop, chunk, device_copy_bytes(chunk), trace_detail);
}

// A chunk with bytes nowhere gets a zeroed host copy for a host access
// (acquire_host, relayout); a fetch zeroes the device copy instead.
Status ChunkManager::materialize_locked(Chunk& chunk) {
  if (Status status = ensure_host_copy_allocated_locked(chunk); status != Status::ok) {
    return status;
  }
  std::memset(chunk.host.data, 0, chunk.capacity);
  chunk.host_current = true;
  chunk.sealed = true;  // Note [Sealed chunks] in chunk_layout.cc
  return Status::ok;
}

Status ChunkManager::ensure_host_copy_allocated_locked(Chunk& chunk) {
  if (chunk.host.data != nullptr) return Status::ok;
  if (Status status = host_pool_.allocate(chunk.capacity, &chunk.host); status != Status::ok) {
    return fail(status,
                fmt::format("{}: no host memory for its host copy ({}); the host holds "
                            "{} of chunks",
                            chunk_label_locked(chunk), format_bytes(chunk.capacity),
                            format_bytes(static_cast<std::size_t>(stats_.chunk_bytes_host))));
  }
  count_locked(chunk, [&](ChunkStats& s) {
    s.chunk_bytes_host += static_cast<std::int64_t>(chunk.host.bytes);
  });
  return Status::ok;
}

// Both copies go; the chunk's bytes read as zeros next time.
void ChunkManager::release_payloads_locked(Chunk& chunk) {
  if (chunk.resident()) drop_device_copy_locked(chunk);
  if (chunk.host.data != nullptr) {
    mover_.wait_for_moves(chunk.moves);  // Note [Waiting outside the lock]: the exception
    count_locked(chunk, [&](ChunkStats& s) {
      s.chunk_bytes_host -= static_cast<std::int64_t>(chunk.host.bytes);
    });
    host_pool_.deallocate(chunk.host);
    chunk.host = {};
  }
  chunk.host_current = false;
  chunk.device_current = false;
}

// --- Pressure ------------------------------------------------------------

// Note [Evicting under pressure]
std::size_t ChunkManager::relieve_pressure(std::size_t bytes, Stream /*stream*/) {
  if (t_allocating_manager == this) return 0;  // our own fetch evicts by itself
  std::lock_guard lock(mutex_);
  std::size_t freed = 0;
  std::size_t evicted = 0;
  while (freed < bytes) {
    const std::optional<ChunkId> victim = policy_->choose_victim(Candidates(*this));
    if (!victim) break;
    Chunk* chunk = find_chunk_locked(*victim);
    if (chunk == nullptr || !chunk->resident() || chunk->in_use()) break;
    const std::size_t device_bytes = device_copy_bytes(*chunk);
    if (evict_locked(*chunk) != Status::ok) break;
    freed += device_bytes;
    ++evicted;
  }
  policy_->on_spill(evicted);
  if (freed != 0) {
    SPILLWAY_LOG(debug, "chunk manager: evicted {} under allocator pressure ({} asked)",
                 format_bytes(freed), format_bytes(bytes));
  }
  return freed;
}

std::string ChunkManager::describe_holdings() const {
  // Called by the allocator, maybe from inside our own fetch on this thread,
  // with our lock held (Note [Evicting under pressure]).
  if (t_allocating_manager == this) return describe_holdings_locked();
  std::lock_guard lock(mutex_);
  return describe_holdings_locked();
}

// --- Stats and lookups ---------------------------------------------------

template <typename Update>
void ChunkManager::count_locked(const Chunk& chunk, Update update) {
  update(stats_);
  auto client = clients_.find(chunk.client);
  if (client != clients_.end()) update(client->second.stats);
}

void ChunkManager::note_stall_locked(const Chunk& chunk, std::int64_t stalled_ns) {
  count_locked(chunk, [&](ChunkStats& s) { s.stall_ns += stalled_ns; });
  step_stall_ns_ += stalled_ns;
  trace_chunk_locked(TraceEventKind::stall, chunk, static_cast<std::uint64_t>(stalled_ns));
}

std::uint64_t ChunkManager::end_step() {
  std::lock_guard lock(mutex_);
  const std::uint64_t step = ++steps_ended_;
  stats_.stall_last_step_ns = std::exchange(step_stall_ns_, 0);
  stats_.stall_expected_last_step_ns = std::exchange(step_stall_expected_ns_, 0);
  policy_->note_time(policy_clock_ns_locked());
  policy_->on_step_end();
  prefetch_planned_locked();  // the next step's first chunks
  write_back_ahead_locked();
  // The step that ended, with the stall the copy model expected in it.
  trace_mark_locked(TraceEventKind::step, step,
                    static_cast<std::uint64_t>(stats_.stall_expected_last_step_ns));
  return step;
}

Chunk* ChunkManager::find_chunk_locked(ChunkId id) const {
  const auto index = static_cast<std::size_t>(id);
  return index < chunks_.size() ? chunks_[index].get() : nullptr;
}

TensorRecord* ChunkManager::find_tensor_locked(TensorId id) const {
  const auto index = static_cast<std::size_t>(id);
  if (index >= tensors_.size()) return nullptr;
  TensorRecord* tensor = tensors_[index].get();
  return tensor != nullptr && tensor->alive ? tensor : nullptr;
}

Status ChunkManager::unknown_tensor(const char* operation, TensorId id) const {
  return fail(Status::invalid_argument,
              fmt::format("{} of tensor {}, which is not registered (or its client was removed)",
                          operation, static_cast<std::uint64_t>(id)));
}

Status ChunkManager::fail(Status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

std::string ChunkManager::last_error() { return t_last_error; }

std::size_t ChunkManager::last_overrun_bytes() { return t_last_overrun_bytes; }

}  // namespace spillway
