// The vocabulary of the chunk manager: identifiers, what a tensor is, where
// a chunk's bytes are, and what a caller can ask of an access. Plain types
// only, so the policy, the observers and the torch bridge can name them
// without seeing the manager.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spillway {

// Identifiers are never reused while the manager lives (a removed client's
// ids stay dead), so a stale id is an error rather than another object.
enum class ClientId : std::uint32_t {};
enum class ChunkId : std::uint32_t {};
enum class TensorId : std::uint64_t {};

// What a tensor holds. Tensors of one client, kind and slot share chunks, so
// the chunks that one phase of training touches (say, the Adam variances)
// are touched together.
enum class TensorKind : std::uint8_t { param, grad, master, optimizer_state };

// Where a chunk's current bytes are. `none`: never written, or discarded; its
// tensors read as zeros once accessed.
enum class Location : std::uint8_t { none, device, host };

// A tensor's state; a chunk's state is the highest of its tensors'
// (compute > hold > free). compute: acquired, in use by a caller; hold: its
// bytes matter but nobody uses them now (evictable); free: its bytes do not
// matter (registered and never acquired, or discarded).
enum class TensorState : std::uint8_t { free, hold, compute };

// An acquire for reading leaves the host copy current, so the chunk can later
// be dropped from the device without a write-back.
enum class AccessMode : std::uint8_t { read, read_write };

// How acquire waits for a fetch in flight: `stream` makes the caller's stream
// wait for the fetch's event (the host does not block; right for kernels on
// that stream), `host` blocks until the bytes are there (right for code that
// reads device memory from the host, as on the simulated device).
enum class WaitMode : std::uint8_t { stream, host };

// What acquire does when the chunk cannot be made resident within the budget
// because every resident chunk is in compute: `fail` (out_of_memory), or
// `overrun`, for an op that must run now (Note [Budget overruns] in
// chunk_manager.cc): the chunk comes in past the budget, recorded.
enum class OverBudget : std::uint8_t { fail, overrun };

struct TensorSpec {
  TensorKind kind = TensorKind::param;
  // Optimizer state slot (e.g. 0: Adam's exp_avg, 1: exp_avg_sq); 0 otherwise.
  std::uint32_t slot = 0;
  std::size_t dtype_bytes = 4;
  std::size_t element_count = 0;
  // For messages, e.g. "layers.3.attn.weight".
  std::string name;
  // Tensors share chunks only within one pack group (and one kind and
  // slot): data parallel optimizers give each owner's state a group of its
  // own, so that no state chunk holds two owners' state (Note [Optimizer
  // state packed by owner] in hooks/torch/chunked_optimizer.cc).
  std::uint32_t pack_group = 0;

  std::size_t bytes() const { return dtype_bytes * element_count; }
};

// Where a tensor is now; the address is what its storage should point at.
struct TensorInfo {
  ClientId client{};
  ChunkId chunk{};
  std::size_t offset = 0;  // in the chunk
  std::size_t bytes = 0;
  TensorKind kind = TensorKind::param;
  std::uint32_t slot = 0;
  TensorState state = TensorState::free;
  Location location = Location::none;
  // Device memory when on the device; otherwise the host copy, or (under
  // strict_residency) an inaccessible address that faults on use; null when
  // the chunk has no bytes anywhere and strict_residency is off.
  void* address = nullptr;
  std::string name;
};

struct ChunkInfo {
  ClientId client{};
  TensorKind kind = TensorKind::param;
  std::uint32_t slot = 0;
  std::size_t capacity_bytes = 0;
  std::size_t used_bytes = 0;  // up to the end of the last tensor; what a move copies
  std::size_t tensor_count = 0;
  Location location = Location::none;
  TensorState state = TensorState::free;
  bool dirty = false;        // the device copy is newer than the host copy
  bool pinned_host = false;  // the host copy is in pinned memory
};

std::string_view to_string(TensorKind kind);
std::string_view to_string(Location location);
std::string_view to_string(TensorState state);

}  // namespace spillway
