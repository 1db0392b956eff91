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
//  - Fetches queued behind: the fetch stream is a FIFO, so a fetch started
//    at its own latest start leaves the next one no time: on the demo's GPT
//    at 52 MiB (bench_train), two chunks the optimizer updates one after the
//    other were fetched together at the first one's latest start, and the
//    second stalled about 1 ms a step. So a fetch must also arrive by the
//    latest start of the fetches queued behind it: taken in order of use
//    (kFetchesBehind at most, within kFetchesBehind margined copies of its
//    use), each starts at the latest that lands it before its use and lets
//    the one behind it start at its own (latest_start_behind). A zero fill
//    queues on no stream and constrains nothing.
//  - Unknown durations (no traced times: a clock that never moved), or an
//    unknown bandwidth: every fetch starts as early as room allows, as before
//    timing existed.
//  - Expected stall: how far after its use the fetch is modelled to arrive
//    when it starts; with the stalls the host measured, it goes to the stats
//    (stall_ns.expected, stall_ns.actual and their .last_step).
#pragma once

#include <cstdint>
#include <vector>

namespace spillway {

// The margin on a modelled copy time (Note [Prefetch timed by op durations]).
inline constexpr double kCopyTimeMargin = 1.25;
inline constexpr std::uint64_t kMarginNs = 20'000;

// Fetches queued behind a candidate that its timing considers (Note [Prefetch
// timed by op durations]).
inline constexpr std::size_t kFetchesBehind = 8;

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

// A copy's modelled time with the margin: kCopyTimeMargin times it, plus kMarginNs.
std::uint64_t margined_copy_ns(std::uint64_t copy_ns);

// When the fetch would arrive if queued at `start_ns`.
std::uint64_t arrival_ns(const FetchTiming& timing, std::uint64_t start_ns);

// True when the fetch must start now: queued at the next decision point, it
// would arrive after its use less the margin.
bool must_start_now(const FetchTiming& timing);

// How late the fetch arrives after its use when started now (0: in time).
std::uint64_t expected_stall_ns(const FetchTiming& timing);

// A fetch that will queue behind the candidate on the same stream.
struct QueuedFetch {
  std::uint64_t use_ns = 0;  // its predicted use
  std::uint64_t copy_ns = 0;
};

// The latest time the first of `behind` (in order of use) can start so that
// each, started at its latest, lands before its use with the margin and
// before the latest start of the one after it: the time by which a fetch
// queued ahead of them must arrive. max() when `behind` is empty; 0 when
// even a start at time 0 is too late.
std::uint64_t latest_start_behind(const std::vector<QueuedFetch>& behind);

}  // namespace spillway
