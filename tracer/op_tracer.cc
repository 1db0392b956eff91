// OpTracer: sequence numbers, interned names, op_begin/op_end records. See
// Note [Op events] in op_tracer.h.
#include "tracer/op_tracer.h"

#include <functional>
#include <thread>

#include "tracer/op_name_records.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace spillway {

std::uint64_t trace_thread_id() {
  thread_local const std::uint64_t id = [] {
#if defined(__linux__)
    return static_cast<std::uint64_t>(::syscall(SYS_gettid));
#else
    return static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
#endif
  }();
  return id;
}

// Ids count from 1 in order of first use. The definition is recorded under
// the lock: another thread finds the id only after its records are in the
// sink, so no op event can precede its name's definition.
std::uint32_t OpTracer::name_id(std::string_view name, std::uint64_t time_ns) {
  std::lock_guard lock(names_mutex_);
  if (const auto found = names_.find(name); found != names_.end()) return found->second;
  const auto id = static_cast<std::uint32_t>(names_.size() + 1);
  sink_.record_together(op_name_records(id, name, time_ns));
  names_.emplace(std::string(name), id);
  return id;
}

TracedOp OpTracer::begin(std::string_view name, std::uint64_t parent, std::uint64_t thread,
                         std::uint64_t time_ns) {
  TracedOp op;
  op.name_id = name_id(name, time_ns);
  op.sequence = next_sequence_.fetch_add(1, std::memory_order_relaxed);
  op.parent = parent;
  op.thread = thread;
  op.begin_ns = time_ns;
  TraceEvent event;
  event.time_ns = time_ns;
  event.kind = TraceEventKind::op_begin;
  event.client = op.name_id;
  event.stream = thread;
  event.address = op.sequence;
  event.size = parent;
  sink_.record(event);
  return op;
}

void OpTracer::end(const TracedOp& op, std::uint64_t time_ns) {
  if (time_ns < op.begin_ns) time_ns = op.begin_ns;  // keeps the duration well-defined
  TraceEvent event;
  event.time_ns = time_ns;
  event.kind = TraceEventKind::op_end;
  event.client = op.name_id;
  event.stream = op.thread;
  event.address = op.sequence;
  event.size = time_ns - op.begin_ns;
  sink_.record(event);
}

}  // namespace spillway
