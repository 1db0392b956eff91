// OpTracer: the op events of a trace (format version 3), for the op hooks.
//
// Note [Op events]
// An op that touches managed tensors is bracketed by op_begin and op_end
// records; the chunk_access and chunk_release records of its inputs, and any
// fetches they cause, fall between the two. Each op gets a process-wide
// sequence number, from 1, in the order ops start: the planner's "moment",
// and the external correlation id the op hooks will push to CUPTI so kernel
// and memcpy records can be tied to their op. Ops nest (aten::t runs
// aten::transpose): op_begin names the enclosing traced op of its thread. Op
// names are interned: the first op of a name defines its id with op_name
// records (op_name_records.h), under the tracer's lock, so the definition
// reaches the sink before any record that uses the id.
//
// Record fields (docs/trace-format.md has the table):
//   op_begin: client = name id, stream = thread, address = sequence number,
//             size = sequence number of the enclosing op (0: none)
//   op_end:   client = name id, stream = thread, address = sequence number,
//             size = end time - begin time (ns)
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tracer/trace_event.h"

namespace spillway {

// An op between begin() and end().
struct TracedOp {
  std::uint64_t sequence = 0;
  std::uint64_t parent = 0;  // the enclosing op's sequence number; 0 when none
  std::uint64_t thread = 0;
  std::uint64_t begin_ns = 0;
  std::uint32_t name_id = 0;
};

// The calling thread's id as op events record it: the kernel's thread id
// (gettid) on Linux, the one profilers and CUPTI show.
std::uint64_t trace_thread_id();

class OpTracer {
 public:
  // `sink` must outlive the tracer.
  explicit OpTracer(TraceSink& sink) : sink_(sink) {}

  OpTracer(const OpTracer&) = delete;
  OpTracer& operator=(const OpTracer&) = delete;

  // Records op_begin (and the name's definition on its first use).
  TracedOp begin(std::string_view name, std::uint64_t parent, std::uint64_t thread,
                 std::uint64_t time_ns);
  // Records op_end. `time_ns` must not precede op.begin_ns on the same clock.
  void end(const TracedOp& op, std::uint64_t time_ns);

  std::uint64_t ops_begun() const { return next_sequence_.load(std::memory_order_relaxed) - 1; }

 private:
  std::uint32_t name_id(std::string_view name, std::uint64_t time_ns);

  // Lookup by string_view without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  TraceSink& sink_;
  std::atomic<std::uint64_t> next_sequence_{1};
  std::mutex names_mutex_;
  std::unordered_map<std::string, std::uint32_t, NameHash, std::equal_to<>> names_;
};

}  // namespace spillway
