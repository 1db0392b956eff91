// When a planned prefetch starts: as late as it can while still arriving
// before its use.
//
// Note [Prefetch timed by op durations]
// The planned policy (Note [Planned prefetch] in planned_policy.h) knows which
// chunk comes next; this decides when its fetch starts. Once activations
// share the device budget, a fetch started too early takes memory that the
// ops before its use need, and the allocator spills chunks for them: room
// taken early can force a spill that a later start avoids. So:
//  - Durations: the policy stamps every access of the traced step with the
//    device clock (Device::now_ns(): the wall clock on the simulated device).
//    The op hooks acquire an op's inputs as it begins, so the gaps between
//    accesses are the traced ops' durations. While following, the policy
//    predicts when an access comes from the latest access's real time plus
//    the traced time between the two (the next step follows the traced step's
//    length, from its first access to its end).
//  - Copy time: the chunk's bytes over the copy bandwidth (the simulated
//    device's sim_bandwidth, or copy_bandwidth), queued behind the fetches
//    already on the fetch stream (a FIFO): the manager models when that
//    stream goes idle. A chunk with bytes nowhere is zeroed instead, on a
//    stream of its own (Note [Two copy streams] in chunk_mover.cc): it
//    queues behind nothing, and is timed as a copy of its bytes
//    (ChunkManager::fetch_ns_locked says why).
//  - The decision is taken at accesses (and releases). A fetch waits while
//    starting it at the next expected access still lands it before its use
//    with the margin (kCopyTimeMargin times the copy, plus kMarginNs);
//    otherwise it starts now. So it starts at the last decision point that
//    is in time, and takes its room no earlier.
//  - Unknown durations (no traced times: a clock that never moved), or an
//    unknown bandwidth: every fetch starts as early as room allows, as before
//    timing existed.
//  - Expected stall: how far after its use the fetch is modelled to arrive
//    when it starts; with the stalls the host measured, it goes to the stats
//    (stall_ns.expected, stall_ns.actual and their .last_step).
#pragma once

#include <cstdint>

namespace spillway {

// The margin on a modelled copy time (Note [Prefetch timed by op durations]).
inline constexpr double kCopyTimeMargin = 1.25;
inline constexpr std::uint64_t kMarginNs = 20'000;

// One candidate fetch, on the device clock.
struct FetchTiming {
  std::uint64_t now_ns = 0;
  // The next expected access: the next point the fetch could start at.
  std::uint64_t next_decision_ns = 0;
  std::uint64_t use_ns = 0;  // the predicted use
  // The work already queued on the stream that would bring the chunk in
  // ends then (the fetch stream's fetches; a zero fill's stream is idle:
  // now).
  std::uint64_t stream_free_at_ns = 0;
  std::uint64_t copy_ns = 0;  // the modelled copy
};

// When the fetch would arrive if queued at `start_ns`.
std::uint64_t arrival_ns(const FetchTiming& timing, std::uint64_t start_ns);

// True when the fetch must start now: queued at the next decision point, it
// would arrive after its use less the margin.
bool must_start_now(const FetchTiming& timing);

// How late the fetch arrives after its use when started now (0: in time).
std::uint64_t expected_stall_ns(const FetchTiming& timing);

}  // namespace spillway
