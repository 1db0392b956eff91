// The step a trace file recorded as a StepTrace (traced_step.h).
#include "bench/train/traced_step.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

namespace spillway::bench {

namespace {

// Note [Spills are not compute]
// An allocation that spills waits on the host for the victims' slabs (their
// write-backs, fetches still in flight, kernels: Note [Fenced slabs] in
// caching_allocator.cc) inside the op that allocates. Counted as the op's
// compute, those waits raised the simulator's bound with every wait the
// run made: a run whose spills waited 25 ms a step had a bound 25 ms above
// its compute, and so seemed 1.09 of it where it took 1.36 of its compute.
// So each op's duration also leaves out its spills. A spill is the run of
// eviction events (write-backs, the device copies' frees and drops, the
// slabs given back and taken) that ends with the block's alloc and the
// spill_for_allocation event, all written on the allocating thread, and it
// lasts from the first of them to the last. This is the host time of the
// spill (the wait, and the eviction's own bookkeeping, a few microseconds).
//
// The host time of the spill that ends with the spill_for_allocation event
// events[at].
std::uint64_t spill_ns(const std::vector<TraceEvent>& events, std::size_t at) {
  std::size_t first = at;
  // The block's own alloc comes just before.
  if (first > 0 && events[first - 1].kind == TraceEventKind::alloc) --first;
  bool evicted = false;
  while (first > 0) {
    const TraceEventKind kind = events[first - 1].kind;
    const TraceEventKind next = events[first].kind;
    // A victim's device copy is freed just before its drop, after its
    // write-back if dirty; any other free is an activation's, before the spill.
    const bool in_spill = kind == TraceEventKind::chunk_drop ||
                          kind == TraceEventKind::segment_free ||
                          kind == TraceEventKind::segment_alloc ||
                          (kind == TraceEventKind::free && next == TraceEventKind::chunk_drop) ||
                          (kind == TraceEventKind::chunk_writeback &&
                           (next == TraceEventKind::free || next == TraceEventKind::chunk_drop));
    if (!in_spill) break;
    evicted = evicted || kind == TraceEventKind::chunk_drop;
    --first;
  }
  if (!evicted || events[at].time_ns < events[first].time_ns) return 0;
  return events[at].time_ns - events[first].time_ns;
}

}  // namespace

TracedStep traced_step(const TraceFileContents& trace, std::uint64_t step) {
  TracedStep result;
  const std::vector<TraceEvent>& events = trace.events;
  // Live allocator bytes and resident chunk capacity over the whole trace, so
  // the step starts from the right figures.
  std::unordered_map<std::uint64_t, std::uint64_t> live_blocks;  // address -> bytes
  std::uint64_t live_bytes = 0;
  std::uint64_t resident_chunk_bytes = 0;
  bool in_step = step == 1;
  std::uint64_t step_start_ns = 0;  // step 1: its first op
  std::uint64_t step_end_ns = 0;
  std::vector<std::uint64_t> begins;  // each moment's begin
  std::vector<std::uint64_t> stalls;  // host stalls and spills inside each moment
  // Chunks zeroed on the device and not accessed since: their next access is fresh.
  std::unordered_set<std::uint64_t> zero_filled;
  auto non_model = [&] {
    return live_bytes > resident_chunk_bytes ? live_bytes - resident_chunk_bytes : 0;
  };
  for (std::size_t index = 0; index < events.size(); ++index) {
    const TraceEvent& event = events[index];
    switch (event.kind) {
      case TraceEventKind::alloc:
        live_blocks[event.address] = event.size;
        live_bytes += event.size;
        break;
      case TraceEventKind::free: {
        const auto found = live_blocks.find(event.address);
        if (found != live_blocks.end()) {
          live_bytes -= found->second;
          live_blocks.erase(found);
        }
        break;
      }
      case TraceEventKind::chunk_fetch:
        resident_chunk_bytes += event.stream;  // chunk events: stream is the capacity
        result.chunk_size = std::max(result.chunk_size, event.stream);
        // Size 0: zeroed on the device (docs/trace-format.md).
        if (event.size == 0) {
          zero_filled.insert(event.address);
        } else {
          zero_filled.erase(event.address);
        }
        break;
      case TraceEventKind::chunk_drop:
        resident_chunk_bytes -= std::min(resident_chunk_bytes, event.stream);
        break;
      default:
        break;
    }
    // Whether this access is the first since a zero fill, before or in the step.
    const bool fresh =
        event.kind == TraceEventKind::chunk_access && zero_filled.erase(event.address) > 0;
    if (event.kind == TraceEventKind::step) {
      if (event.address + 1 == step) {
        in_step = true;
        step_start_ns = event.time_ns;
      }
      if (event.address == step) {
        step_end_ns = event.time_ns;
        break;
      }
      continue;
    }
    if (!in_step) continue;
    plan::StepTrace& out = result.step;
    if (event.kind == TraceEventKind::op_begin && event.size == 0) {
      const auto name = trace.op_names.find(event.client);
      out.ops.push_back(
          plan::TracedOp{name == trace.op_names.end() ? "op" : name->second, 0, non_model(), {}});
      begins.push_back(event.time_ns);
      stalls.push_back(0);
      continue;
    }
    if (out.ops.empty()) continue;
    plan::TracedOp& op = out.ops.back();
    op.non_model_bytes = std::max(op.non_model_bytes, non_model());
    if (event.kind == TraceEventKind::stall) stalls.back() += event.size;
    if (event.kind == TraceEventKind::spill_for_allocation)
      stalls.back() += spill_ns(events, index);
    if (event.kind == TraceEventKind::chunk_access) {
      const auto chunk = static_cast<plan::PlanChunk>(event.address);
      const bool write = event.detail == kTraceDetailReadWrite;
      const auto seen = std::find_if(op.chunks.begin(), op.chunks.end(),
                                     [&](const plan::ChunkUse& use) { return use.chunk == chunk; });
      if (seen == op.chunks.end()) {
        op.chunks.push_back({chunk, write, fresh});
      } else {
        seen->write = seen->write || write;
      }
    }
  }
  if (step_end_ns == 0) {
    result.error = fmt::format("the trace has no end of step {}", step);
    return result;
  }
  if (result.step.ops.empty()) {
    result.error = fmt::format("step {} of the trace has no ops (op events need format 3)", step);
    return result;
  }
  result.wall_ns = step_end_ns - (step == 1 ? begins.front() : step_start_ns);
  for (std::size_t i = 0; i < begins.size(); ++i) {
    const std::uint64_t end = i + 1 < begins.size() ? begins[i + 1] : step_end_ns;
    const std::uint64_t span = end > begins[i] ? end - begins[i] : 0;
    result.step.ops[i].duration_ns = span > stalls[i] ? span - stalls[i] : 0;
  }
  return result;
}

}  // namespace spillway::bench
