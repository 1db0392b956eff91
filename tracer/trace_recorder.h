// TraceRecorder: the TraceSink that writes a trace file (the `trace` option).
//
// Design summary:
//  - record() appends to one in-memory batch under a mutex: a lock and a copy,
//    no allocation, no I/O (cheap enough to call inside the allocator).
//  - A full batch is handed to a writer thread that encodes it into the file;
//    emptied batches are reused. At most `max_pending_batches` wait for the
//    writer; beyond that record() blocks until one is written, so memory stays
//    bounded at about (max_pending_batches + 3) * batch_events events (one
//    filling, one being written, one more a flush() may add) whatever the
//    event rate. See Note [Trace order].
//  - flush() makes everything recorded so far reach the file; close() also
//    writes the end record. After close() (or a write error) events are
//    counted as dropped, so a sink that outlives its file stays harmless (the
//    process-wide runtime closes it at exit while the allocator lives on).
//
// Note [Trace order]
// The file holds events in the order record() was called, across all
// threads. Replay depends on it (a free must follow its alloc, and an address
// reused by another thread must be freed before it is handed out again), so
// batches are global, not per thread. Callers record an event while the state
// it describes is still theirs (Note [Recording under the allocator's lock])
// for the order of calls to be the order of effects.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tracer/trace_event.h"
#include "tracer/trace_file.h"

namespace spillway {

struct TraceRecorderOptions {
  std::size_t batch_events = 4096;      // events per batch handed to the writer
  std::size_t max_pending_batches = 4;  // full batches waiting before record() blocks
};

class TraceRecorder final : public TraceSink {
 public:
  // Creates the trace file at `path` and starts the writer thread. Null with
  // *error set when the file cannot be created.
  static std::unique_ptr<TraceRecorder> open(const std::string& path, const TraceMetadata& metadata,
                                             std::string* error, TraceRecorderOptions options = {});

  TraceRecorder(std::unique_ptr<TraceFileWriter> writer, TraceRecorderOptions options);
  ~TraceRecorder() override;  // close()

  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  void record(const TraceEvent& event) override;
  void record_together(std::span<const TraceEvent> events) override;

  // Returns once every event recorded before the call is in the file (handed
  // to the operating system). False after a write error.
  bool flush();
  // flush(), then the end record; the file is complete. Idempotent.
  // `end_time_ns` is stored in the end record.
  bool close(std::uint64_t end_time_ns = 0);

  // Events in the file or on their way to it.
  std::uint64_t recorded_events() const;
  // Events that will not reach the file: recorded after close(), or lost to a
  // write error.
  std::uint64_t dropped_events() const;
  // The first write error; empty when none.
  std::string error() const;
  const std::string& path() const { return path_; }

 private:
  using Batch = std::vector<TraceEvent>;

  void submit_current_locked();
  void run_writer();

  const TraceRecorderOptions options_;
  const std::string path_;
  std::unique_ptr<TraceFileWriter> writer_;  // touched only by the writer thread until joined

  std::mutex close_mutex_;  // one close() at a time; the others wait for it

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // writer waits: batches pending, or stop
  std::condition_variable done_cv_;  // producers wait: room in pending_, or batches written
  Batch current_;
  std::deque<Batch> pending_;
  std::vector<Batch> spare_;  // written batches, kept for reuse
  std::uint64_t submitted_batches_ = 0;
  std::uint64_t written_batches_ = 0;
  std::uint64_t recorded_ = 0;
  std::uint64_t dropped_ = 0;
  bool stopping_ = false;
  bool closed_ = false;
  bool failed_ = false;
  std::string error_;

  std::thread writer_thread_;
};

}  // namespace spillway
