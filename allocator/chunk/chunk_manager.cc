// ChunkManager: model data in chunks that move between the device and host
// memory, shared by every model and optimizer in the process.
//
// Design summary
// --------------
// Clients (models, optimizers) register tensors by kind; each tensor gets a
// place (chunk, offset) in a chunk of its client's (kind, slot) list
// (chunk_packer.h: Note [Packing tensors]; chunk_layout.cc: Note [Sealed
// chunks], the relayout hint and client removal). A chunk is the unit of
// residency and of movement:
//
//  - payloads: a device copy from the caching allocator (on the fetch
//    stream, one slab per chunk) and a host copy from the HostPool (pinned
//    while host_budget lasts). Either, both (clean) or neither may exist;
//    `device_current` / `host_current` say which holds the bytes. Dirty =
//    current on the device only.
//  - location (Chunk::location): device when it has a device copy, else host
//    when the host copy is current, else none (never written: reads as zero).
//  - state, derived from its tensors: compute (acquired on either side) >
//    hold (bytes matter, nobody uses them) > free. A chunk in compute is
//    never evicted; one in hold may be; one whose tensors are all free has
//    its payloads released (discard).
//
// Eviction is the policy's choice among resident chunks not in compute
// (eviction_policy.h; LRU by default). A dirty chunk is written back first;
// a clean one is just dropped. Evictions happen when a fetch needs room in
// the chunk budget or in the allocator, and when the allocator asks
// (Note [Evicting under pressure]). Observers (chunk_observer.h) learn every
// tensor's new address at each move.
//
// The access protocol (acquire/release, acquire_host/release_host, prefetch,
// discard) runs under one mutex. Nothing under it blocks on the device
// except where noted (Note [Waiting outside the lock]); moves are queued on
// two copy streams and complete through events.
//
// Note [Two copy streams]
// Fetches (host to device) run on fetch_stream_, write-backs (device to
// host) on writeback_stream_, so a fetch and an eviction overlap, as a GPU's
// two copy engines allow. The orderings that matter, each made with an
// event wait on the device side, never by blocking the host:
//   - a write-back reads the device copy after every use of it: the
//     write-back stream waits for the chunk's release events (Note [Streams
//     and chunk payloads]) and for its fetch;
//   - a fetch reads the host copy after the write-back that produced it:
//     the fetch stream waits for written_back;
//   - a caller's work reads the device copy after its fetch: acquire makes
//     the caller's stream wait for `fetched` (or blocks, WaitMode::host);
//   - a fetch writes a reused block after the work on its previous chunk
//     (Note [Reuse fences]).
//
// Note [Streams and chunk payloads]
// The device copy is allocated on the fetch stream, so that stream owns the
// block: the allocator hands it out again only to our next fetch (nobody
// else allocates on that stream), at once, with no device-side ordering of
// its own. So a dropped block must not be written by a later fetch before
// everything that used it is done: the callers' kernels (an event recorded
// at each release, per stream) and the write-back reading it. We join those
// on the write-back stream and record a *reuse fence* there (one event per
// dropped block, Note [Reuse fences]).
//
// Note [Reuse fences]
// A fetch that is handed a block overlapping a fenced one makes the fetch
// stream wait for that fence before copying into it. Waiting at reuse rather
// than at drop time matters: a fetch into some other free block does not
// queue behind the evicted chunk's kernels and write-back, so prefetches
// overlap write-backs (two copy engines) and compute. We avoid
// record_stream: its deferred free would hide the block from the allocator
// until the callers' streams drain, so a pressure retry would find nothing.
// Fences of blocks that the allocator returned to the device are harmless:
// returning a segment (cudaFree, SimDevice::free) waits for all device work,
// and completed fences are pruned.
//
// Note [Evicting under pressure]
// The allocator asks us (relieve_pressure) when a request on some stream S
// does not fit. We evict through the policy until enough capacity is freed;
// each eviction queues its write-back and deallocates at once (Note [Reuse
// fences]), so nothing blocks here.
// The freed blocks belong to the fetch stream, and S cannot take them as
// blocks; but each is a whole slab (chunk_size = large_slab_bytes), so the
// allocator's retry returns those segments to the device and reserves one
// for S. Returning a segment (cudaFree, SimDevice::free) waits for all
// device work, our write-backs included, so the memory is idle when S gets
// it. Chunks of 1 MiB or less live in the allocator's small pool, two to a
// slab, and a freed one may not free a slab: use chunks above 1 MiB.
// When the allocator calls us from inside our own fetch (we asked it for a
// device copy and it ran out), we answer 0: the fetch evicts by itself,
// under the lock it already holds (AllocatingScope).
//
// Note [Waiting outside the lock]
// Host waits (WaitMode::host, acquire_host) happen after unlocking, so other
// threads keep acquiring. The chunk is pinned first (its users count), so
// the event waited for cannot be recorded again meanwhile: a chunk in use is
// neither evicted nor fetched. The exceptions, which block under the lock,
// are rare and need the moves finished before memory is given back:
// freeing a host copy (discard, remove_client, relayout) and synchronize().
//
// Note [Host access to device copies]
// WaitMode::host is for code that touches the device copy from the host (the
// simulated device, where torch's CPU kernels run on device memory). The host
// is then one more stream: besides the fetch, it waits for the work released
// on every stream that used the chunk, as a write-back does, or it could read
// bytes that a queued kernel has yet to write. WaitMode::stream does not
// order the caller's stream after other streams' work on the chunk; as in
// PyTorch, handing a tensor between streams is the caller's to synchronize.
//
// Note [Strict residency]
// With strict_residency each chunk reserves an inaccessible range of its
// capacity, and a tensor not on the device has its address there, so a
// kernel or host read that missed its acquire faults instead of reading
// stale bytes. Observers are told these addresses like any other.
//
// Note [Errors say who holds what]
// A fetch that cannot make room fails with the chunk, the budget and the
// chunks in compute with the tensors acquired in them, because "out of
// memory" alone does not tell a user which acquire was never released.
#include "allocator/chunk/chunk_manager.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "allocator/chunk/chunk.h"
#include "allocator/config/format_bytes.h"
#include "allocator/config/invariant.h"
#include "allocator/config/log.h"
#include "allocator/policy/lru_policy.h"

namespace spillway {
namespace {

thread_local std::string t_last_error;
// The manager whose fetch is inside CachingAllocator::allocate on this thread.
thread_local const ChunkManager* t_allocating_manager = nullptr;

std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return std::size_t{16} << 30;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
}

}  // namespace

ChunkManagerOptions ChunkManagerOptions::from_config(const Config& config) {
  ChunkManagerOptions options;
  options.chunk_size = config.chunk_size;
  options.host_budget_bytes = config.host_budget.resolve(physical_memory_bytes());
  options.strict_residency = config.strict_residency;
  options.planned_prefetch = config.prefetch;
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

ChunkManager::ChunkManager(Device& device, CachingAllocator& allocator, ChunkManagerOptions options,
                           std::unique_ptr<EvictionPolicy> policy, TraceSink* trace)
    : device_(device),
      allocator_(allocator),
      options_(options),
      host_pool_(device, options.host_budget_bytes),
      policy_(policy ? std::move(policy) : std::make_unique<LruPolicy>()),
      device_budget_bytes_(options.device_budget_bytes),
      trace_(trace) {
  if (device_.create_stream(&fetch_stream_) != Status::ok ||
      device_.create_stream(&writeback_stream_) != Status::ok) {
    // Moves then run on the default stream: correct, just without overlap.
    SPILLWAY_LOG(warn,
                 "chunk manager: creating its copy streams failed ({}); moves use the "
                 "default stream",
                 device_.last_error());
  }
  allocator_.add_pressure_handler(this);
}

ChunkManager::~ChunkManager() {
  allocator_.remove_pressure_handler(this);
  std::lock_guard lock(mutex_);
  observers_.clear();  // they may be gone already; nobody binds to us any more
  for (auto& chunk : chunks_) {
    if (chunk) free_chunk_locked(*chunk);
  }
  device_.synchronize_stream(fetch_stream_);
  device_.synchronize_stream(writeback_stream_);
  for (const ReuseFence& fence : reuse_fences_) device_.destroy_event(fence.event);
  for (Event event : spare_events_) device_.destroy_event(event);
  if (fetch_stream_.handle != nullptr) device_.destroy_stream(fetch_stream_);
  if (writeback_stream_.handle != nullptr) device_.destroy_stream(writeback_stream_);
}

// --- Access protocol -----------------------------------------------------

Status ChunkManager::acquire(TensorId id, Stream stream, void** device_ptr, AccessMode access,
                             WaitMode wait) {
  *device_ptr = nullptr;
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
      if (Status status = fetch_locked(chunk, FetchReason::use, tensor); status != Status::ok) {
        return status;
      }
    }
    SPILLWAY_INVARIANT(chunk.resident(), "an acquire hands out only resident bytes");
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
    if (chunk.fetch_pending && device_.query_event(chunk.fetched) == Status::ok) {
      chunk.fetch_pending = false;
    }
    if (wait == WaitMode::stream) {
      if (chunk.fetch_pending)
        device_.wait_event(stream, chunk.fetched);  // Note [Two copy streams]
    } else {
      // Note [Host access to device copies]
      if (chunk.fetch_pending) host_waits.push_back(chunk.fetched);
      for (const StreamUse& use : chunk.stream_uses) {
        if (use.pending && device_.query_event(use.last_release) != Status::ok) {
          host_waits.push_back(use.last_release);
        }
      }
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
    chunk.fetch_pending = false;
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
  record_release_locked(chunk, stream);
  --chunk.device_users;
  trace_chunk_locked(TraceEventKind::chunk_release, chunk, static_cast<std::uint64_t>(id));
  if (--tensor->device_users == 0 && tensor->host_users == 0) {
    tensor->state = TensorState::hold;
    ++chunk.held_tensors;
  }
  if (chunk.device_users == 0) prefetch_planned_locked();  // it may be the victim now
  return Status::ok;
}

// Note [Streams and chunk payloads]: one event per stream, recorded again at
// each release there; an eviction waits for the latest of each.
void ChunkManager::record_release_locked(Chunk& chunk, Stream stream) {
  auto use = std::find_if(chunk.stream_uses.begin(), chunk.stream_uses.end(),
                          [&](const StreamUse& u) { return u.stream == stream; });
  if (use == chunk.stream_uses.end()) {
    Event event{};
    if (device_.create_event(&event) != Status::ok) {
      // Without an event, order by waiting for the stream itself.
      device_.synchronize_stream(stream);
      return;
    }
    use = chunk.stream_uses.insert(chunk.stream_uses.end(), StreamUse{stream, event, false});
  }
  device_.record_event(use->last_release, stream);
  use->pending = true;
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
    // The host copy is written by a write-back, and read by a fetch that a
    // host write must not overtake.
    if (chunk.writeback_pending) waits.push_back(chunk.written_back);
    if (access == AccessMode::read_write) {
      if (chunk.fetch_pending) waits.push_back(chunk.fetched);
      if (chunk.resident()) {
        drop_device_copy_locked(chunk);  // it would be stale
        notify_locked(chunk);
      }
    }
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
    chunk.writeback_pending = false;
    if (access == AccessMode::read_write) chunk.fetch_pending = false;
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
  device_.synchronize_stream(fetch_stream_);
  device_.synchronize_stream(writeback_stream_);
  for (auto& chunk : chunks_) {
    if (chunk) chunk->fetch_pending = chunk->writeback_pending = false;
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

// The smaller of our cap and the allocator's whole budget: no chunk larger
// than this can ever be on the device.
std::size_t ChunkManager::effective_budget_locked() const {
  return std::min(device_budget_bytes_, allocator_.budget_bytes());
}

Status ChunkManager::fetch_locked(Chunk& chunk, FetchReason reason, const TensorRecord* wanted_by) {
  const bool is_prefetch = reason != FetchReason::use;
  const std::size_t budget = effective_budget_locked();
  if (chunk.capacity > budget) {
    if (reason == FetchReason::planned_prefetch) return Status::out_of_memory;  // its use will say
    return fail(
        Status::out_of_memory,
        fmt::format("{} of {}: its {} needs {} on the device, more than the whole {} "
                    "budget of {}",
                    is_prefetch ? "prefetch" : "acquire", tensor_label_locked(*wanted_by),
                    chunk_label_locked(chunk), format_bytes(chunk.capacity),
                    budget == device_budget_bytes_ ? "chunk" : "device", format_bytes(budget)));
  }
  if (Status status = make_room_locked(chunk, reason, wanted_by); status != Status::ok) {
    return status;
  }
  void* data = nullptr;
  if (Status status = allocate_device_copy_locked(chunk, reason, wanted_by, &data);
      status != Status::ok) {
    return status;
  }
  wait_for_reuse_fences_locked(data, chunk.capacity);
  Status status = ensure_events_locked(chunk);
  if (status == Status::ok && chunk.location() == Location::none)
    status = materialize_locked(chunk);
  if (status != Status::ok) {
    allocator_.deallocate(data);
    return status;
  }
  // Note [Two copy streams]: read the host copy after its write-back.
  if (chunk.writeback_pending) device_.wait_event(fetch_stream_, chunk.written_back);
  if (status = device_.copy_async(data, chunk.host.data, chunk.used_bytes, fetch_stream_);
      status != Status::ok) {
    allocator_.deallocate(data);
    return fail(status, fmt::format("fetch of {}: the copy failed: {}", chunk_label_locked(chunk),
                                    device_.last_error()));
  }
  device_.record_event(chunk.fetched, fetch_stream_);
  chunk.fetch_pending = true;
  chunk.device_data = data;
  chunk.device_current = true;
  resident_bytes_ += chunk.capacity;
  policy_->on_resident(chunk.id);
  count_locked(chunk, [&](ChunkStats& s) {
    s.chunk_bytes_device += static_cast<std::int64_t>(chunk.capacity);
    s.bytes_moved_h2d += static_cast<std::int64_t>(chunk.used_bytes);
    ++s.fetches;
    if (is_prefetch) ++s.prefetches;
  });
  trace_chunk_locked(TraceEventKind::chunk_fetch, chunk, chunk.used_bytes,
                     is_prefetch ? kTraceDetailPrefetch : 0);
  notify_locked(chunk);
  return Status::ok;
}

// Evicts until `incoming` fits in the chunk budget.
Status ChunkManager::make_room_locked(Chunk& incoming, FetchReason reason,
                                      const TensorRecord* wanted_by) {
  const Chunk* planned = reason == FetchReason::planned_prefetch ? &incoming : nullptr;
  while (resident_bytes_ + incoming.capacity > device_budget_bytes_) {
    if (evict_one_locked(planned)) continue;
    if (reason != FetchReason::use) return Status::out_of_memory;  // advice only: keep quiet
    return fail(Status::out_of_memory,
                fmt::format("acquire of {}: no room for its {} ({}) in the chunk budget of {}: "
                            "{} of chunks is on the device and none can be evicted. {}",
                            tensor_label_locked(*wanted_by), chunk_label_locked(incoming),
                            format_bytes(incoming.capacity), format_bytes(device_budget_bytes_),
                            format_bytes(resident_bytes_), describe_in_use_locked()));
  }
  return Status::ok;
}

// A device copy from the allocator; when it is out of memory, evict and try
// again (Note [Evicting under pressure]).
Status ChunkManager::allocate_device_copy_locked(Chunk& chunk, FetchReason reason,
                                                 const TensorRecord* wanted_by, void** data) {
  const Chunk* planned = reason == FetchReason::planned_prefetch ? &chunk : nullptr;
  for (;;) {
    // Evicting first when the allocator surely has no room spares it an
    // out-of-memory (its counters and trace would show one per fetch).
    const Stats allocator_stats = allocator_.stats();
    const auto reserved = static_cast<std::size_t>(allocator_stats.reserved_bytes.current);
    const auto cached = reserved - static_cast<std::size_t>(allocator_stats.active_bytes.current);
    const std::size_t budget = allocator_.budget_bytes();
    const std::size_t headroom = budget > reserved ? budget - reserved : 0;
    if (headroom < chunk.capacity && cached < chunk.capacity && evict_one_locked(planned)) continue;

    Status status;
    {
      AllocatingScope scope(this);
      status = allocator_.allocate(data, chunk.capacity, fetch_stream_);
    }
    if (status == Status::ok) return Status::ok;
    const std::string allocator_error = CachingAllocator::last_error();
    if (status == Status::out_of_memory && evict_one_locked(planned)) continue;
    if (reason != FetchReason::use && status == Status::out_of_memory) return status;
    return fail(
        status,
        fmt::format("acquire of {}: the allocator has no room for its {} ({}) and no "
                    "chunk can be evicted. {} The allocator said: {}",
                    tensor_label_locked(*wanted_by), chunk_label_locked(chunk),
                    format_bytes(chunk.capacity), describe_in_use_locked(), allocator_error));
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
    const std::optional<ChunkId> next = policy_->prefetch_candidate();
    if (!next) return;
    Chunk* chunk = find_chunk_locked(*next);
    if (chunk == nullptr || chunk->resident() || chunk->host_users != 0) return;
    if (fetch_locked(*chunk, FetchReason::planned_prefetch, nullptr) != Status::ok) return;
  }
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
  // Note [Two copy streams]: after every use of the device copy, and after
  // the fetch that may still be reading the host copy we overwrite.
  for (StreamUse& use : chunk.stream_uses) {
    if (use.pending) device_.wait_event(writeback_stream_, use.last_release);
    use.pending = false;  // later work on this stream is ordered after them
  }
  if (chunk.fetch_pending) device_.wait_event(writeback_stream_, chunk.fetched);
  if (Status status = device_.copy_async(chunk.host.data, chunk.device_data, chunk.used_bytes,
                                         writeback_stream_);
      status != Status::ok) {
    return fail(status, fmt::format("write-back of {}: the copy failed: {}",
                                    chunk_label_locked(chunk), device_.last_error()));
  }
  device_.record_event(chunk.written_back, writeback_stream_);
  chunk.writeback_pending = true;
  chunk.host_current = true;
  count_locked(chunk, [&](ChunkStats& s) {
    s.bytes_moved_d2h += static_cast<std::int64_t>(chunk.used_bytes);
    ++s.writebacks;
  });
  trace_chunk_locked(TraceEventKind::chunk_writeback, chunk, chunk.used_bytes);
  return Status::ok;
}

// Gives the device copy back to the allocator, fenced after its users
// (Note [Reuse fences]). The bytes must be current on the host (or not matter).
void ChunkManager::drop_device_copy_locked(Chunk& chunk, std::uint16_t trace_detail) {
  SPILLWAY_INVARIANT(chunk.device_users == 0, "a device copy in use is never given back");
  SPILLWAY_INVARIANT(resident_bytes_ >= chunk.capacity, "resident bytes count every device copy");
  for (StreamUse& use : chunk.stream_uses) {
    if (use.pending) device_.wait_event(writeback_stream_, use.last_release);
    use.pending = false;
  }
  Event fence = take_event_locked();
  if (fence.handle != nullptr) {
    // After the write-back, if any: it was queued on this stream already.
    device_.record_event(fence, writeback_stream_);
    const auto begin = reinterpret_cast<std::uintptr_t>(chunk.device_data);
    reuse_fences_.push_back({begin, begin + chunk.capacity, fence});
  } else {
    device_.synchronize_stream(writeback_stream_);  // no event: idle it the slow way
  }
  allocator_.deallocate(chunk.device_data);
  chunk.device_data = nullptr;
  chunk.device_current = false;
  resident_bytes_ -= chunk.capacity;
  policy_->on_evicted(chunk.id);
  count_locked(chunk, [&](ChunkStats& s) {
    s.chunk_bytes_device -= static_cast<std::int64_t>(chunk.capacity);
  });
  trace_chunk_locked(TraceEventKind::chunk_drop, chunk, chunk.capacity, trace_detail);
}

// Note [Reuse fences]: the fetch stream waits for every fence on [data,
// data + bytes) before writing there; fences already passed are dropped.
void ChunkManager::wait_for_reuse_fences_locked(void* data, std::size_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = begin + bytes;
  std::erase_if(reuse_fences_, [&](const ReuseFence& fence) {
    const bool overlaps = fence.begin < end && begin < fence.end;
    if (overlaps) {
      device_.wait_event(fetch_stream_, fence.event);
    } else if (device_.query_event(fence.event) != Status::ok) {
      return false;
    }
    spare_events_.push_back(fence.event);  // waits read the record at call time
    return true;
  });
}

Event ChunkManager::take_event_locked() {
  Event event{};
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else if (device_.create_event(&event) != Status::ok) {
    event = Event{};
  }
  return event;
}

// A chunk that never had bytes gets a zeroed host copy: the source of its
// first fetch, or what acquire_host hands out.
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
    wait_for_moves_locked(chunk);  // Note [Waiting outside the lock]: the exception
    count_locked(chunk, [&](ChunkStats& s) {
      s.chunk_bytes_host -= static_cast<std::int64_t>(chunk.host.bytes);
    });
    host_pool_.deallocate(chunk.host);
    chunk.host = {};
  }
  chunk.host_current = false;
  chunk.device_current = false;
}

void ChunkManager::wait_for_moves_locked(Chunk& chunk) {
  if (chunk.fetch_pending) device_.synchronize_event(chunk.fetched);
  if (chunk.writeback_pending) device_.synchronize_event(chunk.written_back);
  chunk.fetch_pending = chunk.writeback_pending = false;
}

Status ChunkManager::ensure_events_locked(Chunk& chunk) {
  if (chunk.events_created) return Status::ok;
  if (device_.create_event(&chunk.fetched) != Status::ok) {
    return fail(Status::error, fmt::format("{}: creating an event failed: {}",
                                           chunk_label_locked(chunk), device_.last_error()));
  }
  if (device_.create_event(&chunk.written_back) != Status::ok) {
    device_.destroy_event(chunk.fetched);
    return fail(Status::error, fmt::format("{}: creating an event failed: {}",
                                           chunk_label_locked(chunk), device_.last_error()));
  }
  chunk.events_created = true;
  return Status::ok;
}

// --- Pressure ------------------------------------------------------------

// Note [Evicting under pressure]
std::size_t ChunkManager::relieve_pressure(std::size_t bytes, Stream /*stream*/) {
  if (t_allocating_manager == this) return 0;  // our own fetch evicts by itself
  std::lock_guard lock(mutex_);
  std::size_t freed = 0;
  while (freed < bytes) {
    const std::optional<ChunkId> victim = policy_->choose_victim(Candidates(*this));
    if (!victim) break;
    Chunk* chunk = find_chunk_locked(*victim);
    if (chunk == nullptr || !chunk->resident() || chunk->in_use()) break;
    const std::size_t capacity = chunk->capacity;
    if (evict_locked(*chunk) != Status::ok) break;
    freed += capacity;
  }
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

// --- Observers -----------------------------------------------------------

void ChunkManager::add_observer(ChunkObserver* observer) {
  std::lock_guard lock(mutex_);
  observers_.push_back(observer);
}

void ChunkManager::remove_observer(ChunkObserver* observer) {
  std::lock_guard lock(mutex_);
  std::erase(observers_, observer);
}

void ChunkManager::notify_locked(const Chunk& chunk) {
  if (observers_.empty()) return;
  moved_scratch_.clear();
  for (TensorId id : chunk.tensors) {
    const TensorRecord& tensor = *find_tensor_locked(id);
    moved_scratch_.push_back(
        {id, tensor.client, tensor_address_locked(chunk, tensor), chunk.location()});
  }
  for (ChunkObserver* observer : observers_) observer->on_tensors_moved(moved_scratch_);
}

void* ChunkManager::tensor_address_locked(const Chunk& chunk, const TensorRecord& tensor) const {
  if (chunk.resident()) return static_cast<char*>(chunk.device_data) + tensor.offset;
  if (options_.strict_residency && chunk.inaccessible.data() != nullptr) {
    return static_cast<char*>(chunk.inaccessible.data()) +
           tensor.offset;  // Note [Strict residency]
  }
  if (chunk.host_current) return static_cast<char*>(chunk.host.data) + tensor.offset;
  return nullptr;
}

// --- Stats and lookups ---------------------------------------------------

template <typename Update>
void ChunkManager::count_locked(const Chunk& chunk, Update update) {
  update(stats_);
  auto client = clients_.find(chunk.client);
  if (client != clients_.end()) update(client->second.stats);
}

// Recorded under the lock, as the allocator does, so the trace's order is the
// order of effects (Note [Trace order] in trace_recorder.h): a chunk's fetch
// follows the alloc of its device copy.
void ChunkManager::trace_chunk_locked(TraceEventKind kind, const Chunk& chunk, std::uint64_t size,
                                      std::uint16_t detail) {
  if (trace_ == nullptr) return;
  TraceEvent event;
  event.time_ns = device_.now_ns();
  event.kind = kind;
  event.stream = chunk.capacity;
  event.address = static_cast<std::uint64_t>(chunk.id);
  event.size = size;
  event.detail = detail;
  event.client = static_cast<std::uint32_t>(chunk.client);
  trace_->record(event);
}

void ChunkManager::note_stall_locked(const Chunk& chunk, std::int64_t stalled_ns) {
  count_locked(chunk, [&](ChunkStats& s) { s.stall_ns += stalled_ns; });
  trace_chunk_locked(TraceEventKind::stall, chunk, static_cast<std::uint64_t>(stalled_ns));
}

std::uint64_t ChunkManager::end_step() {
  std::lock_guard lock(mutex_);
  const std::uint64_t step = ++steps_ended_;
  policy_->on_step_end();
  prefetch_planned_locked();  // the next step's first chunks
  if (trace_ != nullptr) {
    TraceEvent event;
    event.time_ns = device_.now_ns();
    event.kind = TraceEventKind::step;
    event.address = step;
    trace_->record(event);
  }
  return step;
}

PolicyState ChunkManager::policy_state() const {
  std::lock_guard lock(mutex_);
  return policy_->state();
}

std::string_view ChunkManager::policy_name() const {
  std::lock_guard lock(mutex_);
  return policy_->name();
}

std::uint64_t ChunkManager::steps_ended() const {
  std::lock_guard lock(mutex_);
  return steps_ended_;
}

ChunkStats ChunkManager::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

ChunkStats ChunkManager::client_stats(ClientId id) const {
  std::lock_guard lock(mutex_);
  auto client = clients_.find(id);
  return client == clients_.end() ? ChunkStats{} : client->second.stats;
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

}  // namespace spillway
