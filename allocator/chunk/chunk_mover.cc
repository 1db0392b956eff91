// ChunkMover: payload copies on two copy streams, ordered by events.
//
// Note [Two copy streams]
// Fetches (host to device) run on fetch_stream_, write-backs (device to
// host) on writeback_stream_, so a fetch and an eviction overlap, as a GPU's
// two copy engines allow. Zero fills (Note [A chunk without bytes is zeroed
// on the device] in chunk_manager.cc) run on a third stream, fill_stream_:
// a fill takes microseconds and no link, and on the fetch stream it queued
// behind every copy ahead of it (a FIFO), so a gradient chunk zeroed for the
// backward waited for milliseconds of unrelated fetches. The orderings that
// matter, each made with an event wait on the device side, never by
// blocking the host:
//   - a write-back reads the device copy after every use of it: the
//     write-back stream waits for the payload's release events (Note
//     [Streams and chunk payloads]) and for its fetch;
//   - a fetch reads the host copy after the write-back that produced it:
//     the fetch stream waits for written_back;
//   - a caller's work reads the device copy after its fetch: the caller's
//     stream waits for `fetched` (order_after_fetch), or the host does;
//   - a caller's work that writes the device copy waits for a write-back
//     still reading it (a write-back ahead of a spill keeps the device copy:
//     Note [Write-backs ahead of spills] in planned_policy.h);
//   - a fetch or a zero fill writes a reused block after the work on its
//     previous payload (Note [Reuse fences]); nothing else orders a fill on
//     its own stream after the fetch stream's earlier work in that block.
//
// Note [Streams and chunk payloads]
// The device copy is allocated on the fetch stream, so that stream owns the
// block: the allocator hands it out again only to our next fetch (nobody
// else allocates on that stream), at once, with no device-side ordering of
// its own. So a dropped block must not be written by a later fetch before
// everything that used it is done: the callers' kernels (an event recorded
// at each release, per stream) and the write-back reading it. We join those
// on a stream of fences and record a *reuse fence* there (one event per
// dropped block, Note [Reuse fences]).
//
// Note [Reuse fences]
// A fetch that is handed a block overlapping a fenced one makes the fetch
// stream wait for that fence before copying into it. Waiting at reuse rather
// than at drop time matters: a fetch into some other free block does not
// queue behind the evicted payload's kernels and write-back, so prefetches
// overlap write-backs (two copy engines) and compute. We avoid
// record_stream: its deferred free would hide the block from the allocator
// until the callers' streams drain, so a pressure retry would find nothing.
// Fences of blocks that the allocator returned to the device are harmless:
// returning a segment (cudaFree, SimDevice::free) waits for all device work,
// and completed fences are pruned, their events kept for the next fence.
//
// The fences are recorded on a stream of their own, fence_stream_, that
// holds nothing but event waits and fences. The allocator gives a spilled
// block back after its fence (Note [Fenced slabs] in caching_allocator.cc),
// and the fence used to be recorded last on the write-back stream, a FIFO:
// a clean copy, with no write-back of its own, then waited for every
// write-back queued before it, milliseconds of other chunks' bytes at the
// simulated link's rate. On its own stream a fence waits for the copy's own
// work alone: its fetch, its users, and its write-back if it has one (the
// write-backs ahead of that one too, as the link runs them in order).
#include "allocator/chunk/chunk_mover.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "allocator/config/log.h"

namespace spillway {
namespace {

thread_local std::string t_last_error;

Status fail(Status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

bool contains(std::span<const Event> events, Event event) {
  return std::find(events.begin(), events.end(), event) != events.end();
}

// Note [Streams and chunk payloads]: `stream` waits for the latest release
// on every stream whose work on the copy nothing has waited for yet.
void wait_for_pending_releases(Device& device, const PayloadMoves& moves, Stream stream) {
  for (const StreamUse& use : moves.stream_uses)
    if (use.pending) device.wait_event(stream, use.last_release);
}

}  // namespace

ChunkMover::ChunkMover(Device& device) : device_(device) {
  if (device_.create_stream(&fetch_stream_) != Status::ok ||
      device_.create_stream(&writeback_stream_) != Status::ok) {
    SPILLWAY_LOG(warn,
                 "chunk manager: creating its copy streams failed ({}); moves use the "
                 "default stream",
                 device_.last_error());
  }
  // Without a stream of their own, fills are correct on the fetch stream,
  // only queued behind its copies, and fences on the write-back stream,
  // behind its write-backs.
  if (device_.create_stream(&fill_stream_) != Status::ok) fill_stream_ = fetch_stream_;
  if (device_.create_stream(&fence_stream_) != Status::ok) fence_stream_ = writeback_stream_;
}

ChunkMover::~ChunkMover() {
  synchronize();
  for (const ReuseFence& fence : reuse_fences_) device_.destroy_event(fence.event);
  if (fill_stream_.handle != nullptr && fill_stream_.handle != fetch_stream_.handle)
    device_.destroy_stream(fill_stream_);
  if (fence_stream_.handle != nullptr && fence_stream_.handle != writeback_stream_.handle)
    device_.destroy_stream(fence_stream_);
  if (fetch_stream_.handle != nullptr) device_.destroy_stream(fetch_stream_);
  if (writeback_stream_.handle != nullptr) device_.destroy_stream(writeback_stream_);
}

Status ChunkMover::fetch(PayloadMoves& moves, void* device_data, std::size_t block_bytes,
                         const void* host_data, std::size_t bytes) {
  if (Status status = ensure_events(moves); status != Status::ok) return status;
  wait_for_reuse_fences(device_data, block_bytes, fetch_stream_);
  // Note [Two copy streams]: read the host copy after its write-back.
  if (moves.writeback_pending) device_.wait_event(fetch_stream_, moves.written_back);
  if (Status status = device_.copy_async(device_data, host_data, bytes, fetch_stream_);
      status != Status::ok) {
    return fail(status, fmt::format("the copy failed: {}", device_.last_error()));
  }
  device_.record_event(moves.fetched, fetch_stream_);
  moves.fetch_pending = true;
  return Status::ok;
}

Status ChunkMover::zero_fill(PayloadMoves& moves, void* device_data, std::size_t block_bytes,
                             std::size_t bytes) {
  if (Status status = ensure_events(moves); status != Status::ok) return status;
  wait_for_reuse_fences(device_data, block_bytes, fill_stream_);
  if (Status status = device_.fill_zero_async(device_data, bytes, fill_stream_);
      status != Status::ok) {
    return fail(status, fmt::format("the zero fill failed: {}", device_.last_error()));
  }
  device_.record_event(moves.fetched, fill_stream_);
  moves.fetch_pending = true;
  return Status::ok;
}

Status ChunkMover::write_back(PayloadMoves& moves, void* host_data, const void* device_data,
                              std::size_t bytes) {
  if (Status status = ensure_events(moves); status != Status::ok) return status;
  // Note [Two copy streams]: after every use of the device copy, and after
  // the fetch that may still be reading the host copy we overwrite.
  order_writeback_after_releases(moves);
  if (moves.fetch_pending) device_.wait_event(writeback_stream_, moves.fetched);
  if (Status status = device_.copy_async(host_data, device_data, bytes, writeback_stream_);
      status != Status::ok) {
    return fail(status, fmt::format("the copy failed: {}", device_.last_error()));
  }
  device_.record_event(moves.written_back, writeback_stream_);
  moves.writeback_pending = true;
  return Status::ok;
}

// Note [Reuse fences]
void ChunkMover::fence_reuse(PayloadMoves& moves, void* device_data, std::size_t block_bytes) {
  // The releases a write-back already waited for are covered by its event.
  wait_for_pending_releases(device_, moves, fence_stream_);
  // A fetch still writing the block: our own next fetch would queue behind
  // it anyway, but the allocator may give the memory back after this fence
  // (Note [Fenced slabs] in caching_allocator.cc).
  if (moves.fetch_pending) device_.wait_event(fence_stream_, moves.fetched);
  if (moves.writeback_pending) device_.wait_event(fence_stream_, moves.written_back);
  Event fence = spare_events_.take();
  if (fence.handle == nullptr) {
    device_.synchronize_stream(fence_stream_);  // no event: idle it the slow way
    return;
  }
  device_.record_event(fence, fence_stream_);
  const auto begin = reinterpret_cast<std::uintptr_t>(device_data);
  reuse_fences_.push_back({begin, begin + block_bytes, fence});
}

// Note [Streams and chunk payloads]: one event per stream, recorded again at
// each release there; a write-back or a fence waits for the latest of each.
void ChunkMover::record_release(PayloadMoves& moves, Stream stream) {
  auto use = std::find_if(moves.stream_uses.begin(), moves.stream_uses.end(),
                          [&](const StreamUse& u) { return u.stream == stream; });
  if (use == moves.stream_uses.end()) {
    Event event{};
    if (device_.create_event(&event) != Status::ok) {
      // Without an event, order by waiting for the stream itself.
      device_.synchronize_stream(stream);
      return;
    }
    use = moves.stream_uses.insert(moves.stream_uses.end(), StreamUse{stream, event, false});
  }
  device_.record_event(use->last_release, stream);
  use->pending = true;
}

void ChunkMover::order_after_fetch(PayloadMoves& moves, Stream stream) {
  if (!fetch_done(moves)) device_.wait_event(stream, moves.fetched);  // Note [Two copy streams]
}

void ChunkMover::order_write_after_write_back(PayloadMoves& moves, Stream stream) {
  if (!write_back_done(moves)) device_.wait_event(stream, moves.written_back);
}

bool ChunkMover::fetch_done(PayloadMoves& moves) {
  if (moves.fetch_pending && device_.query_event(moves.fetched) == Status::ok) {
    moves.fetch_pending = false;
  }
  return !moves.fetch_pending;
}

bool ChunkMover::write_back_done(PayloadMoves& moves) {
  if (moves.writeback_pending && device_.query_event(moves.written_back) == Status::ok) {
    moves.writeback_pending = false;
  }
  return !moves.writeback_pending;
}

// Idle: nothing a host writer of the copy would wait for.
bool ChunkMover::device_copy_idle(PayloadMoves& moves) {
  return waits_before_host_uses_device(moves, /*host_writes=*/true).empty();
}

std::vector<Event> ChunkMover::waits_before_host_uses_device(PayloadMoves& moves,
                                                             bool host_writes) {
  std::vector<Event> waits;
  if (!fetch_done(moves)) waits.push_back(moves.fetched);
  if (host_writes && !write_back_done(moves)) waits.push_back(moves.written_back);
  for (const StreamUse& use : moves.stream_uses) {
    if (use.pending && device_.query_event(use.last_release) != Status::ok) {
      waits.push_back(use.last_release);
    }
  }
  return waits;
}

std::vector<Event> ChunkMover::waits_before_host_touches_host(const PayloadMoves& moves,
                                                              bool host_writes) {
  std::vector<Event> waits;
  // The host copy is written by a write-back, and read by a fetch that a
  // host write must not overtake.
  if (moves.writeback_pending) waits.push_back(moves.written_back);
  if (host_writes && moves.fetch_pending) waits.push_back(moves.fetched);
  return waits;
}

void ChunkMover::note_host_waited(PayloadMoves& moves, std::span<const Event> events) {
  if (contains(events, moves.fetched)) moves.fetch_pending = false;
  if (contains(events, moves.written_back)) moves.writeback_pending = false;
}

void ChunkMover::wait_for_moves(PayloadMoves& moves) {
  if (moves.fetch_pending) device_.synchronize_event(moves.fetched);
  if (moves.writeback_pending) device_.synchronize_event(moves.written_back);
  note_moves_done(moves);
}

void ChunkMover::synchronize() {
  device_.synchronize_stream(fetch_stream_);
  device_.synchronize_stream(fill_stream_);
  device_.synchronize_stream(writeback_stream_);
  device_.synchronize_stream(fence_stream_);
}

void ChunkMover::note_moves_done(PayloadMoves& moves) {
  moves.fetch_pending = moves.writeback_pending = false;
}

void ChunkMover::forget(PayloadMoves& moves) {
  wait_for_moves(moves);
  if (moves.events_created) {
    device_.destroy_event(moves.fetched);
    device_.destroy_event(moves.written_back);
    moves.events_created = false;
  }
  for (StreamUse& use : moves.stream_uses) device_.destroy_event(use.last_release);
  moves.stream_uses.clear();
}

std::string ChunkMover::last_error() { return t_last_error; }

Status ChunkMover::ensure_events(PayloadMoves& moves) {
  if (moves.events_created) return Status::ok;
  if (device_.create_event(&moves.fetched) != Status::ok) {
    return fail(Status::error, fmt::format("creating an event failed: {}", device_.last_error()));
  }
  if (device_.create_event(&moves.written_back) != Status::ok) {
    device_.destroy_event(moves.fetched);
    return fail(Status::error, fmt::format("creating an event failed: {}", device_.last_error()));
  }
  moves.events_created = true;
  return Status::ok;
}

// Note [Reuse fences]: `stream` waits for every fence on [data, data +
// bytes) before writing there; fences already passed are dropped.
void ChunkMover::wait_for_reuse_fences(void* data, std::size_t bytes, Stream stream) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = begin + bytes;
  std::erase_if(reuse_fences_, [&](const ReuseFence& fence) {
    const bool overlaps = fence.begin < end && begin < fence.end;
    if (overlaps) {
      device_.wait_event(stream, fence.event);
    } else if (device_.query_event(fence.event) != Status::ok) {
      return false;
    }
    spare_events_.give_back(fence.event);  // waits read the record at call time
    return true;
  });
}

void ChunkMover::order_writeback_after_releases(PayloadMoves& moves) {
  wait_for_pending_releases(device_, moves, writeback_stream_);
  // Later work on the write-back stream is ordered after them.
  for (StreamUse& use : moves.stream_uses) use.pending = false;
}

}  // namespace spillway
