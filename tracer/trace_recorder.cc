// TraceRecorder: batches under one mutex, a writer thread, bounded memory.
// See the design summary and Note [Trace order] in trace_recorder.h.
#include "tracer/trace_recorder.h"

#include <utility>

namespace spillway {

std::unique_ptr<TraceRecorder> TraceRecorder::open(const std::string& path,
                                                   const TraceMetadata& metadata,
                                                   std::string* error,
                                                   TraceRecorderOptions options) {
  auto writer = TraceFileWriter::create(path, metadata, error);
  if (writer == nullptr) return nullptr;
  return std::make_unique<TraceRecorder>(std::move(writer), options);
}

TraceRecorder::TraceRecorder(std::unique_ptr<TraceFileWriter> writer, TraceRecorderOptions options)
    : options_{options.batch_events == 0 ? 1 : options.batch_events,
               options.max_pending_batches == 0 ? 1 : options.max_pending_batches},
      path_(writer->path()),
      writer_(std::move(writer)) {
  current_.reserve(options_.batch_events);
  writer_thread_ = std::thread([this] { run_writer(); });
}

TraceRecorder::~TraceRecorder() { close(); }

void TraceRecorder::record(const TraceEvent& event) {
  record_together(std::span<const TraceEvent>(&event, 1));
}

// A run of events that must stay consecutive goes into one batch (a fresh
// one when the current batch lacks room), so a crash cuts the file before or
// after them, never inside (unless the run is longer than a batch). A full
// batch with no room to hand it over makes the caller wait for the writer
// (the memory bound), unless the file is gone.
void TraceRecorder::record_together(std::span<const TraceEvent> events) {
  std::unique_lock lock(mutex_);
  auto lacks_room = [&] { return current_.size() + events.size() > options_.batch_events; };
  while (!closed_ && !failed_ && !current_.empty() && lacks_room() &&
         pending_.size() >= options_.max_pending_batches) {
    done_cv_.wait(lock);
  }
  if (closed_ || failed_) {
    dropped_ += events.size();
    return;
  }
  if (!current_.empty() && lacks_room()) submit_current_locked();
  current_.insert(current_.end(), events.begin(), events.end());
  recorded_ += events.size();
  if (current_.size() >= options_.batch_events && pending_.size() < options_.max_pending_batches) {
    submit_current_locked();
  }
}

void TraceRecorder::submit_current_locked() {
  pending_.push_back(std::move(current_));
  if (!spare_.empty()) {
    current_ = std::move(spare_.back());
    spare_.pop_back();
  } else {
    current_ = Batch();
    current_.reserve(options_.batch_events);
  }
  ++submitted_batches_;
  work_cv_.notify_one();
}

void TraceRecorder::run_writer() {
  std::unique_lock lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [this] { return !pending_.empty() || stopping_; });
    if (pending_.empty()) break;  // stopping, and everything is written
    Batch batch = std::move(pending_.front());
    pending_.pop_front();
    const bool already_failed = failed_;
    lock.unlock();
    // Flushing each batch keeps the file current for a process that dies
    // without closing it; batches are large, so this costs little.
    const bool ok = !already_failed && writer_->write(batch) && writer_->flush();
    const std::string write_error = ok || already_failed ? std::string() : writer_->error();
    lock.lock();
    if (!ok) {
      dropped_ += batch.size();
      recorded_ -= batch.size();
      if (!failed_) {
        failed_ = true;
        error_ = write_error;
      }
    }
    batch.clear();
    spare_.push_back(std::move(batch));
    ++written_batches_;
    done_cv_.notify_all();
  }
}

bool TraceRecorder::flush() {
  std::unique_lock lock(mutex_);
  // May exceed max_pending_batches by this one batch; flush is rare.
  if (!current_.empty() && !closed_ && !failed_) submit_current_locked();
  const std::uint64_t target = submitted_batches_;
  done_cv_.wait(lock, [&] { return written_batches_ >= target; });
  return !failed_;
}

bool TraceRecorder::close(std::uint64_t end_time_ns) {
  std::lock_guard close_lock(close_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (closed_) return !failed_;
    if (!current_.empty() && !failed_) submit_current_locked();
    closed_ = true;  // record() drops from here on
    stopping_ = true;
    work_cv_.notify_one();
    done_cv_.notify_all();  // producers blocked on a full queue see closed_
  }
  writer_thread_.join();  // the writer drains pending_ first
  // The writer thread is gone: writer_ is ours.
  const bool finished = writer_->finish(end_time_ns);
  std::lock_guard lock(mutex_);
  if (!finished && !failed_) {
    failed_ = true;
    error_ = writer_->error();
  }
  return !failed_;
}

std::uint64_t TraceRecorder::recorded_events() const {
  std::lock_guard lock(mutex_);
  return recorded_;
}

std::uint64_t TraceRecorder::dropped_events() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

std::string TraceRecorder::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

}  // namespace spillway
