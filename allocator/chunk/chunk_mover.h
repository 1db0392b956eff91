// ChunkMover: the copies that move chunk payloads between the device and the
// host, on two copy streams, and the device-side orderings that keep every
// byte right while copies, kernels and block reuse overlap.
//
// It knows payloads (a device block, a host buffer, their events), not
// chunks, tensors, clients or policies: the chunk manager decides what moves
// and when; the mover makes each move safe (Notes [Two copy streams],
// [Streams and chunk payloads] and [Reuse fences] in chunk_mover.cc).
//
// Typical use, by the owner of a payload:
//
//   ChunkMover mover(device);
//   PayloadMoves moves;                      // one per payload, kept with it
//   allocator.allocate(&block, bytes, mover.fetch_stream());
//   mover.fetch(moves, block, bytes, host, used_bytes);
//   mover.order_after_fetch(moves, compute);  // kernels on `compute` see the bytes
//   ... kernels on `compute` use block ...
//   mover.record_release(moves, compute);
//   mover.write_back(moves, host, block, used_bytes);
//   mover.fence_reuse(moves, block, bytes);   // then give the block back
//   allocator.deallocate(block);
//   mover.forget(moves);                     // the payload is gone
//
// Not thread-safe: its owner calls it under one lock (the chunk manager's).
// The events it hands out for host waits may be waited on outside that lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "allocator/device/device.h"
#include "allocator/device/event_pool.h"

namespace spillway {

// A stream that used a payload's device copy, and an event at its last
// release there: the copy must outlive that work (Note [Streams and chunk
// payloads]).
struct StreamUse {
  Stream stream;
  Event last_release;
  bool pending = false;  // recorded since the payload last left the device
};

// One payload's moves in flight. Kept by the payload's owner (a Chunk),
// changed only through ChunkMover.
struct PayloadMoves {
  Event fetched{};
  Event written_back{};
  bool events_created = false;     // the two events exist from the first move
  bool fetch_pending = false;      // the last fetch may still be running
  bool writeback_pending = false;  // the last write-back may still be running
  std::vector<StreamUse> stream_uses;
};

class ChunkMover {
 public:
  // Creates the fetch and write-back streams; if the device cannot, moves
  // use the default stream (correct, without overlap) and a warning says so.
  explicit ChunkMover(Device& device);
  // Waits for both streams, then destroys them and the fences' and spare
  // events. Payloads' own events go through forget() first.
  ~ChunkMover();

  ChunkMover(const ChunkMover&) = delete;
  ChunkMover& operator=(const ChunkMover&) = delete;

  // Device blocks for fetches are allocated on fetch_stream(), so that
  // stream owns them (Note [Streams and chunk payloads]).
  Stream fetch_stream() const { return fetch_stream_; }
  Stream writeback_stream() const { return writeback_stream_; }
  // Where fence_reuse records its fences: a block given back after its fence
  // is given back after the work on this stream (Note [Reuse fences]).
  Stream fence_stream() const { return fence_stream_; }

  // Queues the copy of `bytes` from `host_data` into `device_data`, a block
  // of `block_bytes` allocated on fetch_stream(): after the reuse fences on
  // that block and after the write-back that produced the host copy.
  Status fetch(PayloadMoves& moves, void* device_data, std::size_t block_bytes,
               const void* host_data, std::size_t bytes);
  // The fetch of a payload that has no bytes anywhere (Note [A chunk without
  // bytes is zeroed on the device] in chunk_manager.cc): `bytes` of
  // `device_data` (allocated on fetch_stream()) set to zero on a stream of
  // its own, not behind the queued fetches (Note [Two copy streams]), after
  // the block's reuse fences, and waited for as a fetch is.
  Status zero_fill(PayloadMoves& moves, void* device_data, std::size_t block_bytes,
                   std::size_t bytes);
  // Queues the copy of `bytes` from `device_data` to `host_data`: after every
  // release of the device copy and after its fetch. The host copy is current
  // once the write-back completes (wait_for_moves, or written_back waited on).
  Status write_back(PayloadMoves& moves, void* host_data, const void* device_data,
                    std::size_t bytes);
  // The device copy [device_data, device_data + block_bytes) goes back to the
  // allocator next: fences it after its fetch, its users and its write-back,
  // so that a later fetch into that memory waits (Note [Reuse fences]). The
  // fence is recorded on fence_stream(), last there.
  void fence_reuse(PayloadMoves& moves, void* device_data, std::size_t block_bytes);

  // Work queued on `stream` used the device copy; it is kept until that work
  // is done (Note [Streams and chunk payloads]).
  void record_release(PayloadMoves& moves, Stream stream);
  // Makes `stream` wait for the fetch in flight, if any.
  void order_after_fetch(PayloadMoves& moves, Stream stream);
  // Makes `stream`, which is about to write the device copy, wait for the
  // write-back reading it, if one may be running.
  void order_write_after_write_back(PayloadMoves& moves, Stream stream);
  // True when no fetch (write-back) of the payload may be running.
  bool fetch_done(PayloadMoves& moves);
  bool write_back_done(PayloadMoves& moves);
  // True when no queued work touches the device copy any more: its fetch,
  // its write-back and the work released on every stream are done.
  bool device_copy_idle(PayloadMoves& moves);

  // The events the host waits for before it touches the device copy: the
  // fetch and the work released on every stream (Note [Host access to device
  // copies] in chunk_manager.cc), and when the host writes, the write-back
  // reading it.
  std::vector<Event> waits_before_host_uses_device(PayloadMoves& moves, bool host_writes);
  // The events the host waits for before it touches the host copy: the
  // write-back writing it and, when the host writes, the fetch reading it.
  std::vector<Event> waits_before_host_touches_host(const PayloadMoves& moves, bool host_writes);
  // The host waited for `events` (outside its owner's lock): the moves among
  // them are no longer pending.
  void note_host_waited(PayloadMoves& moves, std::span<const Event> events);

  // Blocks until the payload's fetch and write-back are done.
  void wait_for_moves(PayloadMoves& moves);
  // Blocks until every move queued so far is done. The owner then calls
  // note_moves_done on its payloads.
  void synchronize();
  void note_moves_done(PayloadMoves& moves);
  // The payload is gone: waits for its moves and destroys its events.
  void forget(PayloadMoves& moves);

  // What the mover holds, for tests and descriptions.
  std::size_t reuse_fence_count() const { return reuse_fences_.size(); }
  std::size_t spare_event_count() const { return spare_events_.spare_count(); }

  // Detail of this thread's last failed call; empty when none.
  static std::string last_error();

 private:
  // Note [Reuse fences]: a block given back, and the event its next user waits for.
  struct ReuseFence {
    std::uintptr_t begin;
    std::uintptr_t end;
    Event event;
  };

  Status ensure_events(PayloadMoves& moves);
  void wait_for_reuse_fences(void* data, std::size_t bytes, Stream stream);
  // Joins the releases on every stream into the write-back stream.
  void order_writeback_after_releases(PayloadMoves& moves);

  Device& device_;
  Stream fetch_stream_{};
  Stream writeback_stream_{};
  Stream fill_stream_{};   // zero fills; fetch_stream_ when it could not be made
  Stream fence_stream_{};  // reuse fences; writeback_stream_ when it could not be made
  std::vector<ReuseFence> reuse_fences_;
  EventPool spare_events_{device_};
};

}  // namespace spillway
