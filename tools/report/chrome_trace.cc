#include "tools/report/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>

#include "tools/report/summary_text.h"

namespace spillway::report {

namespace {

using nlohmann::json;

constexpr int kPid = 1;
constexpr int kAllocatorTid = 0;
// Ops (format version 3) run on the program's threads, not on the
// allocator's or a client's row: a process of their own, a row per thread.
constexpr int kOpsPid = 2;

int client_tid(std::uint32_t client) { return static_cast<int>(client) + 1; }

// Microseconds since the first event.
double micros(const ReportModel& model, std::uint64_t time_ns) {
  return time_ns > model.first_time_ns ? static_cast<double>(time_ns - model.first_time_ns) / 1e3
                                       : 0.0;
}

json name_event(std::string_view kind, int tid, std::string_view name) {
  return {{"name", kind}, {"ph", "M"}, {"pid", kPid},
          {"tid", tid},   {"ts", 0},   {"args", {{"name", name}}}};
}

json counter(const ReportModel& model, std::uint64_t time_ns, std::string_view name,
             std::uint64_t bytes) {
  return {{"name", name},
          {"ph", "C"},
          {"pid", kPid},
          {"tid", kAllocatorTid},
          {"ts", micros(model, time_ns)},
          {"args", {{"bytes", bytes}}}};
}

json instant(const ReportModel& model, std::uint64_t time_ns, std::string name, int tid,
             std::string_view scope, json args) {
  return {{"name", std::move(name)},
          {"ph", "i"},
          {"s", scope},
          {"pid", kPid},
          {"tid", tid},
          {"ts", micros(model, time_ns)},
          {"args", std::move(args)}};
}

// An `X` event for something that lasted `duration_ns` and ended at
// `end_ns`. One that began before the first event is cut there, so no ts is
// negative.
json complete_event(const ReportModel& model, std::string name, int pid, int tid,
                    std::uint64_t end_ns, std::uint64_t duration_ns, json args) {
  const std::uint64_t begin_ns =
      std::max(end_ns >= duration_ns ? end_ns - duration_ns : 0, model.first_time_ns);
  end_ns = std::max(end_ns, begin_ns);
  return {{"name", std::move(name)},
          {"ph", "X"},
          {"pid", pid},
          {"tid", tid},
          {"ts", micros(model, begin_ns)},
          {"dur", static_cast<double>(end_ns - begin_ns) / 1e3},
          {"args", std::move(args)}};
}

void add_counters(const ReportModel& model, std::vector<json>* events) {
  const MemorySample* previous = nullptr;
  for (const MemorySample& sample : model.memory) {
    const auto changed = [&](auto field) {
      return previous == nullptr || field(*previous) != field(sample);
    };
    if (changed([](const MemorySample& s) { return s.allocated_bytes; }))
      events->push_back(counter(model, sample.time_ns, "allocated", sample.allocated_bytes));
    if (changed([](const MemorySample& s) { return s.reserved_bytes; }))
      events->push_back(counter(model, sample.time_ns, "reserved", sample.reserved_bytes));
    if (changed([](const MemorySample& s) { return s.model_bytes; }))
      events->push_back(counter(model, sample.time_ns, "model", sample.model_bytes));
    if (changed([](const MemorySample& s) { return s.non_model_bytes(); }))
      events->push_back(counter(model, sample.time_ns, "non-model", sample.non_model_bytes()));
    previous = &sample;
  }
}

void add_instants(const TraceFileContents& trace, const ReportModel& model,
                  std::vector<json>* events) {
  for (const TraceEvent& event : trace.events) {
    const int tid = client_tid(event.client);
    json chunk_args = {{"chunk", event.address},
                       {"client", event.client},
                       {"bytes", event.size},
                       {"capacity", event.stream}};
    switch (event.kind) {
      case TraceEventKind::step:
        events->push_back(instant(model, event.time_ns, fmt::format("step {}", event.address),
                                  kAllocatorTid, "g", {{"step", event.address}}));
        break;
      case TraceEventKind::oom:
        events->push_back(instant(model, event.time_ns, "out of memory", kAllocatorTid, "p",
                                  {{"requested_bytes", event.size}}));
        break;
      case TraceEventKind::spill_for_allocation:
        events->push_back(instant(model, event.time_ns, "spill for allocation", kAllocatorTid, "t",
                                  {{"requested_bytes", event.size}}));
        break;
      case TraceEventKind::budget_overrun:
        events->push_back(instant(model, event.time_ns,
                                  fmt::format("budget overrun chunk {}", event.address), tid, "p",
                                  {{"chunk", event.address},
                                   {"client", event.client},
                                   {"over_budget_bytes", event.size},
                                   {"capacity", event.stream}}));
        break;
      case TraceEventKind::chunk_fetch:
        chunk_args["prefetch"] = event.detail == kTraceDetailPrefetch;
        events->push_back(instant(
            model, event.time_ns,
            fmt::format("{} chunk {}", event.detail == kTraceDetailPrefetch ? "prefetch" : "fetch",
                        event.address),
            tid, "t", std::move(chunk_args)));
        break;
      case TraceEventKind::chunk_writeback:
        events->push_back(instant(model, event.time_ns,
                                  fmt::format("writeback chunk {}", event.address), tid, "t",
                                  std::move(chunk_args)));
        break;
      case TraceEventKind::chunk_drop:
        chunk_args["eviction"] = event.detail == kTraceDetailEviction;
        events->push_back(instant(
            model, event.time_ns,
            fmt::format("{} chunk {}", event.detail == kTraceDetailEviction ? "evict" : "drop",
                        event.address),
            tid, "t", std::move(chunk_args)));
        break;
      default:
        break;  // allocator events are in the counters; stalls are complete events
    }
  }
}

void add_stalls(const ReportModel& model, std::vector<json>* events) {
  for (const Stall& stall : model.stalls) {
    // Note [Stall time]: the wait ended at time_ns.
    events->push_back(complete_event(
        model, fmt::format("stall on chunk {}", stall.chunk_id), kPid, client_tid(stall.client),
        stall.time_ns, stall.duration_ns,
        {{"chunk", stall.chunk_id}, {"client", stall.client}, {"wait_ns", stall.duration_ns}}));
  }
}

// One complete event per op_end (it carries the op's duration), on its
// thread's row; nested ops nest in the viewer. Returns the threads seen, in
// order of first op.
std::vector<std::uint64_t> add_ops(const TraceFileContents& trace, const ReportModel& model,
                                   std::vector<json>* events) {
  std::vector<std::uint64_t> threads;
  for (const TraceEvent& event : trace.events) {
    if (event.kind != TraceEventKind::op_end) continue;
    auto thread = std::find(threads.begin(), threads.end(), event.stream);
    if (thread == threads.end()) thread = threads.insert(threads.end(), event.stream);
    const auto name = trace.op_names.find(event.client);
    events->push_back(complete_event(
        model, name != trace.op_names.end() ? name->second : fmt::format("op {}", event.client),
        kOpsPid, static_cast<int>(thread - threads.begin()), event.time_ns, event.size,
        {{"sequence", event.address}, {"thread", event.stream}}));
  }
  return threads;
}

}  // namespace

json chrome_trace(const TraceFileContents& trace, const ReportModel& model) {
  std::vector<json> events;
  add_counters(model, &events);
  add_instants(trace, model, &events);
  add_stalls(model, &events);
  const std::vector<std::uint64_t> op_threads = add_ops(trace, model, &events);
  std::stable_sort(events.begin(), events.end(), [](const json& a, const json& b) {
    return a["ts"].get<double>() < b["ts"].get<double>();
  });

  json all = json::array();
  all.push_back(name_event("process_name", kAllocatorTid, "spillway"));
  all.push_back(name_event("thread_name", kAllocatorTid, "allocator"));
  for (const ClientActivity& client : model.clients) {
    all.push_back(
        name_event("thread_name", client_tid(client.client), client_label(client.client)));
  }
  if (!op_threads.empty()) {
    json ops_name = name_event("process_name", 0, "ops");
    ops_name["pid"] = kOpsPid;
    all.push_back(std::move(ops_name));
    for (std::size_t row = 0; row < op_threads.size(); ++row) {
      json thread_name = name_event("thread_name", static_cast<int>(row),
                                    fmt::format("thread {}", op_threads[row]));
      thread_name["pid"] = kOpsPid;
      all.push_back(std::move(thread_name));
    }
  }
  for (json& event : events) all.push_back(std::move(event));

  // A key the file repeats keeps every value, in file order, as an array:
  // an object holds each key once.
  json metadata = json::object();
  for (const auto& [key, value] : model.metadata) {
    auto found = metadata.find(key);
    if (found == metadata.end()) {
      metadata[key] = value;
    } else {
      if (!found->is_array()) *found = json::array({*found});
      found->push_back(value);
    }
  }
  metadata["format_version"] = model.format_version;
  metadata["first_event_time_ns"] = model.first_time_ns;
  return {{"traceEvents", std::move(all)},
          {"displayTimeUnit", "ms"},
          {"metadata", std::move(metadata)}};
}

}  // namespace spillway::report
