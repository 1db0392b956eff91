// bench_train's reading of a traced step (bench/train/traced_step.h): an
// op's compute is its span less the host's stalls and spills inside it
// (Note [Spills are not compute] in traced_step.cc).
#include "bench/train/traced_step.h"

#include <gtest/gtest.h>

namespace spillway::bench {
namespace {

constexpr std::uint64_t kUs = 1000;

TraceEvent at(std::uint64_t time_ns, TraceEventKind kind, std::uint64_t address = 0,
              std::uint64_t size = 0) {
  return TraceEvent{time_ns, kind, 0, address, size};
}

// Step 2 of a trace: op 1 stalls 0.5 ms, frees an activation, computes and
// then spills (a dirty victim's write-back, its copy freed and dropped, its
// slab given back and taken, 4 ms in all); op 2 frees and allocates
// activations without a spill.
TraceFileContents two_ops() {
  TraceFileContents trace;
  trace.op_names = {{1, "aten::mm"}, {2, "aten::add"}};
  std::vector<TraceEvent>& events = trace.events;
  events.push_back(at(0, TraceEventKind::step, 1));
  TraceEvent first = at(1000 * kUs, TraceEventKind::op_begin, 1);
  first.client = 1;
  events.push_back(first);
  events.push_back(at(1500 * kUs, TraceEventKind::alloc, 0x1000, 64));
  events.push_back(at(1600 * kUs, TraceEventKind::alloc, 0x1800, 64));
  events.push_back(at(2000 * kUs, TraceEventKind::stall, 3, 500 * kUs));
  // An activation freed before the kernel that runs until the spill.
  events.push_back(at(2500 * kUs, TraceEventKind::free, 0x1000, 64));
  events.push_back(at(3000 * kUs, TraceEventKind::chunk_writeback, 3, 4096));
  events.push_back(at(3000 * kUs + 1, TraceEventKind::free, 0x2000, 4096));
  events.push_back(at(3000 * kUs + 2, TraceEventKind::chunk_drop, 3, 4096));
  events.push_back(at(7000 * kUs, TraceEventKind::segment_free, 0x2000, 4096));
  events.push_back(at(7000 * kUs + 1, TraceEventKind::segment_alloc, 0x2000, 4096));
  events.push_back(at(7000 * kUs + 2, TraceEventKind::alloc, 0x2000, 2048));
  events.push_back(at(7000 * kUs + 2, TraceEventKind::spill_for_allocation, 0x2000, 2048));
  TraceEvent second = at(9000 * kUs, TraceEventKind::op_begin, 2);
  second.client = 2;
  events.push_back(second);
  events.push_back(at(9500 * kUs, TraceEventKind::free, 0x1800, 64));
  events.push_back(at(9600 * kUs, TraceEventKind::alloc, 0x3000, 64));
  events.push_back(at(12000 * kUs, TraceEventKind::step, 2));
  return trace;
}

TEST(TracedStep, AnOpsComputeLeavesOutItsStallsAndItsSpills) {
  const TracedStep traced = traced_step(two_ops(), 2);
  ASSERT_TRUE(traced.error.empty()) << traced.error;
  ASSERT_EQ(traced.step.ops.size(), 2u);
  EXPECT_EQ(traced.step.ops[0].name, "aten::mm");
  // 8 ms to the next op, less the 0.5 ms stall and the 4 ms spill.
  EXPECT_EQ(traced.step.ops[0].duration_ns, 8000 * kUs - 500 * kUs - (4000 * kUs + 2));
  EXPECT_EQ(traced.step.ops[1].duration_ns, 3000 * kUs) << "frees and allocations are compute";
  EXPECT_EQ(traced.wall_ns, 12000 * kUs);
}

TEST(TracedStep, AnAllocationThatEvictedNothingIsNoSpill) {
  TraceFileContents trace = two_ops();
  // Op 1's eviction events gone: the spill event alone (a retry after frees
  // on other streams) takes no time from the op.
  std::erase_if(trace.events, [](const TraceEvent& event) {
    return event.kind == TraceEventKind::chunk_drop ||
           event.kind == TraceEventKind::chunk_writeback;
  });
  const TracedStep traced = traced_step(trace, 2);
  ASSERT_TRUE(traced.error.empty()) << traced.error;
  EXPECT_EQ(traced.step.ops[0].duration_ns, 8000 * kUs - 500 * kUs);
}

}  // namespace
}  // namespace spillway::bench
