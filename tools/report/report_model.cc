#include "tools/report/report_model.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <utility>

namespace spillway::report {

namespace {

std::optional<std::uint64_t> metadata_bytes(const TraceMetadata& metadata, std::string_view key) {
  const std::optional<std::string> text = find_metadata(metadata, key);
  if (!text) return std::nullopt;
  std::uint64_t value = 0;
  const char* end = text->data() + text->size();
  const auto [at, error] = std::from_chars(text->data(), end, value);
  if (error != std::errc() || at != end) return std::nullopt;
  return value;
}

// Sizes come from the file: a sum of corrupt ones (a stall of 2^64-1 ns in a
// trace cut short, which no CRC covers) stops at the largest value instead of
// wrapping round to a small, plausible one.
void add_saturating(std::uint64_t& total, std::uint64_t amount) {
  total = amount > std::numeric_limits<std::uint64_t>::max() - total
              ? std::numeric_limits<std::uint64_t>::max()
              : total + amount;
}

// Subtracts without wrapping; counts the times there was not enough to subtract.
void subtract_live(std::uint64_t* live, std::uint64_t bytes, std::uint64_t* unmatched) {
  if (bytes > *live) {
    ++*unmatched;
    *live = 0;
  } else {
    *live -= bytes;
  }
}

bool is_chunk_event(TraceEventKind kind) {
  return kind == TraceEventKind::chunk_fetch || kind == TraceEventKind::chunk_writeback ||
         kind == TraceEventKind::chunk_drop || kind == TraceEventKind::stall;
}

// A chunk's device copy is an allocator block: the chunk manager allocates
// it, then records the fetch; records the drop after freeing it. Between the
// two records the copy would read as non-model bytes (or model bytes with no
// block), so the state between them is not a moment of its own.
bool is_half_of_a_chunk_move(const TraceEvent& event, const TraceEvent* next) {
  if (next == nullptr || next->stream != event.size) return false;
  return (event.kind == TraceEventKind::alloc && next->kind == TraceEventKind::chunk_fetch) ||
         (event.kind == TraceEventKind::free && next->kind == TraceEventKind::chunk_drop);
}

// The running state of the one pass.
class ModelBuilder {
 public:
  explicit ModelBuilder(ReportModel* model) : model_(model) {}

  // `next`: the event after this one, or null.
  void add(const TraceEvent& event, const TraceEvent* next) {
    ReportTotals& totals = model_->totals;
    const MemorySample before = current_;
    current_.time_ns = event.time_ns;
    switch (event.kind) {
      case TraceEventKind::alloc:
        ++totals.allocs;
        add_saturating(current_.allocated_bytes, event.size);
        break;
      case TraceEventKind::free:
        ++totals.frees;
        subtract_live(&current_.allocated_bytes, event.size, &totals.unmatched_frees);
        break;
      case TraceEventKind::segment_alloc:
        ++totals.segment_allocs;
        add_saturating(current_.reserved_bytes, event.size);
        break;
      case TraceEventKind::segment_free:
        subtract_live(&current_.reserved_bytes, event.size, &totals.unmatched_frees);
        break;
      case TraceEventKind::oom:
        ++totals.ooms;
        totals.largest_oom_request_bytes = std::max(totals.largest_oom_request_bytes, event.size);
        model_->ooms.push_back({event.time_ns, event.size});
        break;
      case TraceEventKind::spill_for_allocation:
        ++totals.spills_for_allocation;
        break;
      case TraceEventKind::budget_overrun:
        ++totals.budget_overruns;
        totals.largest_overrun_bytes = std::max(totals.largest_overrun_bytes, event.size);
        break;
      case TraceEventKind::min_budget:
        totals.min_budget_bytes = std::max(totals.min_budget_bytes, event.size);
        break;
      case TraceEventKind::chunk_fetch:
        add_fetch(event);
        break;
      case TraceEventKind::chunk_writeback:
        count(client_for(event), [&](auto& figures) {
          ++figures.writebacks;
          add_saturating(figures.bytes_d2h, event.size);
        });
        model_->transfers.push_back({event.time_ns, event.size, false});
        note_used(ChunkKey{event.client, event.address}, event.size);
        break;
      case TraceEventKind::chunk_drop:
        add_drop(event);
        break;
      case TraceEventKind::stall:
        count(client_for(event), [&](auto& figures) {
          ++figures.stalls;
          add_saturating(figures.stall_ns, event.size);
        });
        model_->stalls.push_back({event.time_ns, event.size, event.client, event.address});
        add_saturating(totals.stall_ns_after_steps, event.size);
        break;
      case TraceEventKind::step:
        ++totals.steps;
        model_->steps.push_back({event.time_ns, event.address, totals.ops_after_steps,
                                 totals.stall_ns_after_steps, event.size});
        totals.ops_after_steps = 0;
        totals.stall_ns_after_steps = 0;
        break;
      case TraceEventKind::op_begin:
        ++totals.ops;
        ++totals.ops_after_steps;
        break;
      case TraceEventKind::chunk_access:
        ++totals.chunk_accesses;
        break;
      case TraceEventKind::op_name:
      case TraceEventKind::op_end:
      case TraceEventKind::chunk_release:
        break;
    }
    if (is_chunk_event(event.kind)) model_->has_chunk_events = true;
    if (is_half_of_a_chunk_move(event, next)) return;
    if (current_.allocated_bytes != before.allocated_bytes ||
        current_.reserved_bytes != before.reserved_bytes ||
        current_.model_bytes != before.model_bytes) {
      model_->memory.push_back(current_);
    }
    totals.peak_allocated_bytes = std::max(totals.peak_allocated_bytes, current_.allocated_bytes);
    totals.peak_reserved_bytes = std::max(totals.peak_reserved_bytes, current_.reserved_bytes);
    totals.peak_model_bytes = std::max(totals.peak_model_bytes, current_.model_bytes);
    totals.peak_non_model_bytes = std::max(totals.peak_non_model_bytes, current_.non_model_bytes());
  }

  void finish() {
    for (auto& [id, client] : clients_) model_->clients.push_back(std::move(client));
    for (const auto& [key, capacity] : chunk_capacity_)
      add_saturating(model_->totals.model_size_bytes, capacity);
    for (const auto& [key, used] : chunk_used_) {
      if (used == 0) continue;  // only ever zeroed on the device: its used bytes never seen
      add_saturating(model_->totals.fetched_chunk_used_bytes, used);
      add_saturating(model_->totals.fetched_chunk_capacity_bytes, chunk_capacity_.at(key));
    }
  }

 private:
  using ChunkKey = std::pair<std::uint32_t, std::uint64_t>;  // (client, chunk id)

  // ClientActivity and ReportTotals name their chunk figures alike: one
  // update serves the client and the totals.
  template <typename Update>
  void count(ClientActivity& client, Update update) {
    update(client);
    update(model_->totals);
  }

  ClientActivity& client_for(const TraceEvent& event) {
    auto [it, inserted] = clients_.try_emplace(event.client);
    if (inserted) {
      it->second.client = event.client;
      it->second.residency.push_back({model_->first_time_ns, 0});
    }
    return it->second;
  }

  void note_capacity(ClientActivity& client, const ChunkKey& key, std::uint64_t capacity) {
    auto [it, inserted] = chunk_capacity_.try_emplace(key, capacity);
    if (inserted) {
      add_saturating(client.chunk_bytes, capacity);
    } else if (capacity > it->second) {  // a chunk that grew: count its largest capacity
      add_saturating(client.chunk_bytes, capacity - it->second);
      it->second = capacity;
    }
  }

  // A move's size is the chunk's used bytes; a zero fill moves none.
  void note_used(const ChunkKey& key, std::uint64_t moved_bytes) {
    std::uint64_t& used = chunk_used_[key];
    used = std::max(used, moved_bytes);
  }

  void set_resident(ClientActivity& client, std::uint64_t time_ns, std::uint64_t resident) {
    client.residency.push_back({time_ns, resident});
    client.peak_resident_bytes = std::max(client.peak_resident_bytes, resident);
  }

  void add_fetch(const TraceEvent& event) {
    ClientActivity& client = client_for(event);
    count(client, [&](auto& figures) {
      ++figures.fetches;
      if (event.detail == kTraceDetailPrefetch) ++figures.prefetches;
      add_saturating(figures.bytes_h2d, event.size);
    });
    model_->transfers.push_back({event.time_ns, event.size, true});
    const ChunkKey key{event.client, event.address};
    note_capacity(client, key, event.stream);
    note_used(key, event.size);
    // A fetch of a chunk already on the device (a refill after a writeback)
    // moves bytes but takes no new device memory.
    if (resident_.try_emplace(key, event.stream).second) {
      add_saturating(current_.model_bytes, event.stream);
      std::uint64_t resident = client.residency.back().resident_bytes;
      add_saturating(resident, event.stream);
      set_resident(client, event.time_ns, resident);
    }
  }

  void add_drop(const TraceEvent& event) {
    ClientActivity& client = client_for(event);
    count(client, [&](auto& figures) {
      ++figures.drops;
      if (event.detail == kTraceDetailEviction) ++figures.evictions;
    });
    const ChunkKey key{event.client, event.address};
    note_capacity(client, key, event.stream);
    const auto it = resident_.find(key);
    if (it == resident_.end()) return;  // dropped before the trace saw it arrive
    const std::uint64_t capacity = it->second;
    resident_.erase(it);
    current_.model_bytes -= capacity;
    const std::uint64_t resident = client.residency.back().resident_bytes;
    set_resident(client, event.time_ns, resident >= capacity ? resident - capacity : 0);
  }

  ReportModel* model_;
  MemorySample current_;
  std::map<std::uint32_t, ClientActivity> clients_;
  std::map<ChunkKey, std::uint64_t> resident_;        // device-resident chunks: capacity
  std::map<ChunkKey, std::uint64_t> chunk_capacity_;  // every chunk seen: capacity
  std::map<ChunkKey, std::uint64_t> chunk_used_;      // every chunk fetched: its used bytes
};

}  // namespace

// Note [Chunk fill from the trace]
// The trace has no event for a tensor's registration, but every chunk_fetch
// carries the bytes of the chunk's device copy (stream: a whole slab, or the
// chunk's own size above chunk_size) and copies its used bytes (size): the
// end of its last tensor, which Note [Packing tensors] packs at 256-byte
// boundaries; a write-back copies them too, and a fetch that zeroes a chunk
// with bytes nowhere copies none (Note [A chunk without bytes is zeroed on
// the device]). So the chunks' fill on the device is their used bytes over
// their device copies, over the chunks fetched at least once whose used
// bytes a move showed. It counts alignment padding (under 256 bytes a
// tensor) as used and misses chunks only ever used on the host or only ever
// zeroed; the statistic chunk_fill_ratio is over capacities.
double ReportTotals::chunk_fill_ratio() const {
  return fetched_chunk_capacity_bytes == 0 ? 0.0
                                           : static_cast<double>(fetched_chunk_used_bytes) /
                                                 static_cast<double>(fetched_chunk_capacity_bytes);
}

ReportModel build_report_model(const TraceFileContents& trace) {
  ReportModel model;
  model.format_version = trace.format_version;
  model.metadata = trace.metadata;
  model.device_budget_bytes = metadata_bytes(trace.metadata, "device_budget_bytes");
  model.chunk_size_bytes = metadata_bytes(trace.metadata, "chunk_size_bytes");
  model.totals.event_count = trace.events.size();
  model.op_name_count = trace.op_names.size();
  if (!trace.events.empty()) {
    model.first_time_ns = trace.events.front().time_ns;
    model.last_time_ns = trace.events.back().time_ns;
    model.totals.duration_ns =
        model.last_time_ns > model.first_time_ns ? model.last_time_ns - model.first_time_ns : 0;
  }
  model.memory.push_back({model.first_time_ns, 0, 0, 0});
  ModelBuilder builder(&model);
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent* next = i + 1 < trace.events.size() ? &trace.events[i + 1] : nullptr;
    builder.add(trace.events[i], next);
  }
  builder.finish();
  return model;
}

std::vector<TrafficBucket> traffic_buckets(const ReportModel& model, std::size_t bucket_count) {
  if (bucket_count == 0) return {};
  const std::uint64_t span = std::max<std::uint64_t>(model.totals.duration_ns, 1);
  std::vector<TrafficBucket> buckets(bucket_count);
  for (std::size_t i = 0; i < bucket_count; ++i) {
    buckets[i].start_ns = static_cast<std::uint64_t>(static_cast<double>(span) * i / bucket_count);
    buckets[i].end_ns =
        static_cast<std::uint64_t>(static_cast<double>(span) * (i + 1) / bucket_count);
  }
  const auto bucket_of = [&](std::uint64_t time_ns) {
    const std::uint64_t offset = time_ns > model.first_time_ns ? time_ns - model.first_time_ns : 0;
    const auto index = static_cast<std::size_t>(static_cast<double>(offset) / span * bucket_count);
    return std::min(index, bucket_count - 1);
  };
  for (const Transfer& transfer : model.transfers) {
    TrafficBucket& bucket = buckets[bucket_of(transfer.time_ns)];
    add_saturating(transfer.to_device ? bucket.bytes_h2d : bucket.bytes_d2h, transfer.bytes);
  }
  for (const Stall& stall : model.stalls)
    add_saturating(buckets[bucket_of(stall.time_ns)].stall_ns, stall.duration_ns);
  return buckets;
}

}  // namespace spillway::report
