// ChunkManager: model data (parameters, gradients, fp32 masters, optimizer
// state) in fixed-size chunks that move between the device and host memory,
// for every model and optimizer in the process, under one device budget.
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
// the chunk budget or in the allocator, and when the allocator asks (Note
// [Evicting under pressure] in chunk_manager.cc). Observers
// (chunk_observer.h) learn every tensor's new address at each move.
//
// The access protocol (acquire/release, acquire_host/release_host, prefetch,
// discard) runs under one mutex. Nothing under it blocks on the device
// except where noted (Note [Waiting outside the lock] in chunk_manager.cc).
// Moves are the ChunkMover's (chunk_mover.cc: Notes [Two copy streams],
// [Streams and chunk payloads], [Reuse fences]): queued on two copy streams,
// ordered and completed through events.
//
// The code: chunk_manager.cc (access protocol, residency, pressure),
// chunk_layout.cc (clients, layout), chunk_reports.cc (observers, trace,
// stats, messages), chunk_mover.cc (moves). docs/chunk-manager.md is the
// user's view.
//
// Typical use, from a bridge that binds tensors to chunks:
//
//   ChunkManager chunks(device, allocator, options);
//   ClientId actor = chunks.add_client("actor");
//   TensorId w;
//   chunks.register_tensor(actor, {TensorKind::param, 0, 4, n, "fc.weight"}, &w);
//   void* data;
//   chunks.acquire(w, stream, &data);   // fetched if needed; `stream` waits for it
//   ... kernels on `stream` use data ...
//   chunks.release(w, stream);          // evictable again once that work is done
//
// Every method is thread-safe. Methods return a Status; on failure
// last_error() says why in a sentence with the figures that matter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/caching/pressure_handler.h"
#include "allocator/chunk/chunk_mover.h"
#include "allocator/chunk/chunk_observer.h"
#include "allocator/chunk/chunk_stats.h"
#include "allocator/chunk/chunk_types.h"
#include "allocator/chunk/host_pool.h"
#include "allocator/config/config.h"
#include "allocator/device/device.h"
#include "allocator/policy/eviction_policy.h"
#include "tracer/trace_event.h"

namespace spillway {

// Bookkeeping, private to the implementation (chunk.h).
struct Chunk;
struct TensorRecord;

struct ChunkManagerOptions {
  // Capacity of a chunk. Use the allocator's large_slab_bytes, so a chunk's
  // device copy is exactly one slab (Note [Evicting under pressure]).
  std::size_t chunk_size = 64'000'000;
  // Cap on the capacity of chunks resident on the device. No cap (the
  // default) leaves the allocator's budget as the only bound: chunks fill
  // what activations leave and spill when activations need more.
  std::size_t device_budget_bytes = std::numeric_limits<std::size_t>::max();
  // Cap on pinned host memory (host_budget); past it, pageable memory.
  std::size_t host_budget_bytes = std::numeric_limits<std::size_t>::max();
  // Evicted tensors point at inaccessible memory (see inaccessible_mapping.h).
  bool strict_residency = false;
  // The policy's planned prefetches (Note [Planned prefetch] in
  // planned_policy.h); the `prefetch` option.
  bool planned_prefetch = true;
  // Host-to-device copy bandwidth, bytes per second, for timing planned
  // prefetches (Note [Prefetch timed by op durations] in
  // allocator/policy/prefetch_timing.h); 0: unknown, fetches start as early
  // as room allows. From the simulated device's sim_bandwidth.
  double copy_bytes_per_s = 0;

  // chunk_size, host_budget (resolved against physical memory),
  // strict_residency, prefetch and sim_bandwidth from a configuration.
  static ChunkManagerOptions from_config(const Config& config);
};

class ChunkManager final : public PressureHandler {
 public:
  // Registers itself as a pressure handler of `allocator` until destroyed.
  // `policy` null: LRU. Device payloads come from `allocator`; host payloads
  // from a HostPool of the manager's own. Chunk moves, stalls, device
  // acquires and releases, and step boundaries go to `trace` when set
  // (docs/trace-format.md, version 3).
  // `device`, `allocator` and `trace` must outlive the manager.
  ChunkManager(Device& device, CachingAllocator& allocator, ChunkManagerOptions options,
               std::unique_ptr<EvictionPolicy> policy = nullptr, TraceSink* trace = nullptr);
  // Waits for moves in flight and frees every chunk on both sides.
  ~ChunkManager() override;

  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;

  // --- Clients and registration ----------------------------------------
  // A client is one user of chunks: a model, an optimizer. Its tensors share
  // chunks only with each other, so removing it frees whole chunks.
  ClientId add_client(std::string name);
  // Frees the client's chunks on the device and the host; its tensors and
  // chunks become unknown ids. Fails if one of its tensors is acquired.
  Status remove_client(ClientId client);

  // Places a tensor in one of the client's open chunks for (kind, slot), or
  // a new one (Note [Packing tensors]); a tensor larger than chunk_size gets
  // a chunk of its own. Its bytes read as zeros until written.
  Status register_tensor(ClientId client, const TensorSpec& spec, TensorId* tensor);
  // Re-lays the client's chunks so that tensors sit in the order given (e.g.
  // first use in a traced step), then those not named, in registration
  // order, each (kind, slot) packed separately. Keeps the tensors' bytes;
  // observers learn the new addresses. Meant for before training: fails if
  // one of the client's tensors is acquired.
  Status relayout(ClientId client, std::span<const TensorId> order);

  // --- Access protocol -------------------------------------------------
  // The tensor's device address, its chunk fetched first if needed (evicting
  // others through the policy). The tensor is in compute, so its chunk stays
  // on the device, until the matching release. WaitMode::stream makes
  // `stream` wait for a fetch in flight; WaitMode::host blocks until the
  // bytes are there (counted as stall time). AccessMode::read_write marks
  // the chunk dirty: its eviction then writes it back.
  // OverBudget::overrun: when nothing can be evicted, the chunk comes in past
  // the budget instead of failing (Note [Budget overruns]);
  // last_overrun_bytes() then says by how much.
  Status acquire(TensorId tensor, Stream stream, void** device_ptr,
                 AccessMode access = AccessMode::read_write, WaitMode wait = WaitMode::stream,
                 OverBudget over_budget = OverBudget::fail);
  // Ends one acquire. `stream` is where the work using the tensor was
  // queued: the chunk's device copy is kept until that work is done.
  Status release(TensorId tensor, Stream stream);

  // The tensor's bytes on the host, for code that computes there (a CPU
  // optimizer step on a chunk that is not on the device). Writes back a
  // dirty device copy first and waits for it; with read_write the device
  // copy is dropped (it would be stale). A chunk is used on one side at a
  // time: this fails while one of its tensors is acquired on the device, and
  // acquire fails while one is acquired on the host.
  Status acquire_host(TensorId tensor, void** host_ptr, AccessMode access = AccessMode::read_write);
  Status release_host(TensorId tensor);

  // Starts fetching the tensor's chunk, so a later acquire does not wait.
  // ok when started or already resident; out_of_memory (nothing changed)
  // when no room can be made without evicting a chunk in compute.
  Status prefetch(TensorId tensor);

  // The tensor's bytes no longer matter (state free). When all of a chunk's
  // tensors are free, its payloads are released on both sides and its bytes
  // read as zeros next time. Fails while the tensor is acquired. A tensor
  // free already (not acquired since it was registered or discarded) is
  // left as it is: its chunk, if zeroed on the device since, keeps that copy,
  // which a prefetch made for a coming use.
  Status discard(TensorId tensor);

  // Evicts one chunk now (written back if dirty). Fails while it is in use.
  Status evict(ChunkId chunk);
  // Waits for every move in flight.
  void synchronize();

  // The iteration boundary (spillway::step(), optimizers): counted, and
  // recorded in the trace. Returns the number of the step that ended, from 1.
  std::uint64_t end_step();
  // Steps ended by end_step. Steps the planned policy finds when nothing
  // calls end_step are the policy's (PolicyState::planned_steps), not these:
  // Note [Steps found in the access stream] in planned_policy.h.
  std::uint64_t steps_ended() const;
  // The eviction policy's name and what it reports (planned: its phase,
  // plans built, divergences).
  std::string_view policy_name() const;
  PolicyState policy_state() const;

  // Cap on resident chunk capacity; lowering it evicts down to it now, as
  // far as chunks not in use allow.
  void set_device_budget_bytes(std::size_t bytes);
  std::size_t device_budget_bytes() const;

  // --- Observers ---------------------------------------------------------
  // Not owned; see chunk_observer.h for what they may do.
  void add_observer(ChunkObserver* observer);
  void remove_observer(ChunkObserver* observer);

  // --- Introspection -----------------------------------------------------
  std::optional<TensorInfo> tensor_info(TensorId tensor) const;
  std::optional<ChunkInfo> chunk_info(ChunkId chunk) const;
  std::vector<ChunkId> chunks_of(ClientId client) const;
  std::vector<TensorId> tensors_of(ClientId client) const;
  ChunkStats stats() const;
  // Zeros for an unknown client.
  ChunkStats client_stats(ClientId client) const;
  HostPoolStats host_pool_stats() const { return host_pool_.stats(); }
  // Returns the host pool's cached blocks (pinned ones included).
  void release_cached_host_memory() { host_pool_.release_cached(); }
  const ChunkManagerOptions& options() const { return options_; }
  // The streams moves run on: host-to-device and device-to-host.
  Stream fetch_stream() const { return mover_.fetch_stream(); }
  Stream writeback_stream() const { return mover_.writeback_stream(); }

  // --- PressureHandler ---------------------------------------------------
  std::size_t relieve_pressure(std::size_t bytes, Stream stream) override;
  std::string describe_holdings() const override;

  // Detail of this thread's last failed call; empty when none.
  static std::string last_error();
  // How far past the budget this thread's last acquire brought the device
  // (OverBudget::overrun); 0 when it stayed within it.
  static std::size_t last_overrun_bytes();

  // --- The smallest budget -----------------------------------------------
  // Notes that `user` (an op) needs the chunks of `tensors` on the device at
  // once; the largest such set is min_budget_bytes (Note [The smallest
  // budget]). Returns the capacity of those chunks. Unknown tensors are
  // skipped.
  std::size_t note_working_set(std::span<const TensorId> tensors, std::string_view user);
  std::size_t min_budget_bytes() const;
  // The user of the largest working set; empty when none was noted.
  std::string min_budget_user() const;
  // The smaller of device_budget and the allocator's budget: what resident
  // chunks can hold.
  std::size_t effective_budget_bytes() const;

 private:
  struct Client {
    std::string name;
    ChunkStats stats;
    std::vector<ChunkId> chunks;
    std::vector<TensorId> tensors;
    // The chunks that new tensors of (kind, slot, pack group) may join,
    // oldest first (Note [Packing tensors]): unsealed, at most
    // ChunkPacker::kOpenChunks.
    std::map<std::tuple<TensorKind, std::uint32_t, std::uint32_t>, std::vector<ChunkId>>
        open_chunks;
  };
  class Candidates;
  class FetchClock;
  class AllocatingScope;

  // Registration and layout (chunk_layout.cc).
  // An empty chunk; strict_residency reserves `reserve_bytes`, the most it
  // can grow to.
  Chunk& new_chunk_locked(ClientId client_id, Client& client, TensorKind kind, std::uint32_t slot,
                          std::size_t reserve_bytes);
  void place_tensor_locked(TensorId id, TensorRecord& tensor, Client& client);
  void free_chunk_locked(Chunk& chunk);

  // Moves and residency (chunk_manager.cc).
  // Why a chunk is fetched: an acquire needs it (failing is an error), or
  // a prefetch asks for it (advice: failing changes nothing and says nothing),
  // or the policy's plan does (Note [Planned prefetch] in planned_policy.h:
  // it evicts only the chunk Belady would evict at this one's use, once that
  // chunk's last use before it is done).
  enum class FetchReason { use, prefetch, planned_prefetch };
  Status fetch_locked(Chunk& chunk, FetchReason reason, const TensorRecord* wanted_by,
                      OverBudget over_budget = OverBudget::fail);
  Status make_room_locked(Chunk& incoming, FetchReason reason, const TensorRecord* wanted_by,
                          OverBudget over_budget);
  // Starts the fetches the policy's plan wants next, each when its timing
  // says (Note [Prefetch timed by op durations]).
  void prefetch_planned_locked();
  // Writes back a dirty chunk the next expected spill will evict (Note
  // [Write-backs ahead of spills] in planned_policy.h).
  void write_back_ahead_locked();
  // Tells the policy the clock, the access mode and the non-model bytes, just
  // before the access itself.
  void note_access_context_locked(AccessMode access);
  // The device clock less the host's waits for moves: the policy's clock.
  std::uint64_t policy_clock_ns_locked() const;
  // A device-clock time on the policy's clock: less the host's waits so far,
  // for fetches (stall_ns) and for the device while the allocator gave memory
  // back (CachingAllocator::release_wait_ns).
  std::uint64_t policy_time_locked(std::uint64_t device_ns) const;
  // The modelled copy time of the chunk's fetch; nullopt without a bandwidth.
  std::optional<std::uint64_t> fetch_ns_locked(const Chunk& chunk) const;
  // A fetch was queued: the fetch stream's modelled end moves past it.
  // Returns how long after `now_ns` it is modelled to arrive (0 without a
  // bandwidth).
  std::uint64_t note_fetch_queued_locked(const Chunk& chunk, std::uint64_t now_ns);
  // The stall the copy model expects from a fetch: in the stats.
  void note_expected_stall_locked(const Chunk& chunk, std::uint64_t expected_ns);
  // What a chunk's device copy takes from the allocator (Note [A device
  // copy is a whole slab] in chunk_manager.cc).
  std::size_t device_copy_bytes(const Chunk& chunk) const;
  Status allocate_device_copy_locked(Chunk& chunk, FetchReason reason,
                                     const TensorRecord* wanted_by, OverBudget over_budget,
                                     void** data);
  // Note [Budget overruns]: counted, traced, and what last_overrun_bytes says.
  void note_overrun_locked(const Chunk& chunk, std::size_t over_bytes);
  // After an overrun, evicts chunks no longer in compute until resident
  // chunks and the allocator are within their budgets again.
  void end_overrun_locked();
  // Evicts the policy's victim; for a planned prefetch of `planned_incoming`,
  // the policy's choose_victim_for_prefetch. False when there is none.
  bool evict_one_locked(const Chunk* planned_incoming = nullptr);
  Status evict_locked(Chunk& chunk);
  Status write_back_locked(Chunk& chunk);
  // `trace_detail`: kTraceDetailEviction when evicted for room.
  void drop_device_copy_locked(Chunk& chunk, std::uint16_t trace_detail = 0);
  Status materialize_locked(Chunk& chunk);
  Status ensure_host_copy_allocated_locked(Chunk& chunk);
  void release_payloads_locked(Chunk& chunk);

  // Helpers.
  // Sets last_error() and returns `status`.
  static Status fail(Status status, std::string message);
  Chunk* find_chunk_locked(ChunkId id) const;
  TensorRecord* find_tensor_locked(TensorId id) const;
  Status unknown_tensor(const char* operation, TensorId id) const;
  void* tensor_address_locked(const Chunk& chunk, const TensorRecord& tensor) const;
  void notify_locked(const Chunk& chunk);
  template <typename Update>
  void count_locked(const Chunk& chunk, Update update);
  // Host time spent waiting for the chunk's moves: in the stats and the trace.
  void note_stall_locked(const Chunk& chunk, std::int64_t stalled_ns);
  // A chunk event for the trace (no-op without one); see trace_event.h.
  void trace_chunk_locked(TraceEventKind kind, const Chunk& chunk, std::uint64_t size,
                          std::uint16_t detail = 0);
  // An event of no chunk (step, min_budget): only its address and size.
  void trace_mark_locked(TraceEventKind kind, std::uint64_t address, std::uint64_t size);
  std::string tensor_label_locked(const TensorRecord& tensor) const;
  std::string chunk_label_locked(const Chunk& chunk) const;
  std::string describe_in_use_locked() const;
  std::string describe_holdings_locked() const;
  // Adds the chunks' capacity and tensor bytes to `stats`.
  void add_layout_locked(std::span<const ChunkId> chunks, ChunkStats* stats) const;
  std::size_t effective_budget_locked() const;

  Device& device_;
  CachingAllocator& allocator_;
  const ChunkManagerOptions options_;
  HostPool host_pool_;
  ChunkMover mover_;  // its streams and fences outlive every chunk (destroyed after them)

  mutable std::mutex mutex_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::size_t device_budget_bytes_;
  std::size_t resident_bytes_ = 0;  // capacity of chunks with a device copy
  std::map<ClientId, Client> clients_;
  std::vector<std::unique_ptr<Chunk>> chunks_;          // by ChunkId; null once freed
  std::vector<std::unique_ptr<TensorRecord>> tensors_;  // by TensorId; null once removed
  std::uint32_t next_client_ = 0;
  std::vector<ChunkObserver*> observers_;
  std::vector<TensorAddress> moved_scratch_;  // reused by notify_locked
  ChunkStats stats_;
  TraceSink* const trace_;
  std::uint64_t steps_ended_ = 0;
  // Note [Prefetch timed by op durations].
  std::uint64_t fetch_stream_free_at_ns_ = 0;      // modelled end of the queued fetches
  ChunkId writing_back_ahead_{~std::uint32_t{0}};  // the latest write_back_ahead_locked chunk
  std::int64_t step_stall_ns_ = 0;                 // this step's so far
  std::int64_t step_stall_expected_ns_ = 0;
  bool overrun_outstanding_ = false;  // Note [Budget overruns]
  std::size_t min_budget_bytes_ = 0;  // Note [The smallest budget]
  std::string min_budget_user_;
};

}  // namespace spillway
