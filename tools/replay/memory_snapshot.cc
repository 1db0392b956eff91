// PyTorch memory snapshot -> AllocationTrace; see memory_snapshot.h.
#include "tools/replay/memory_snapshot.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace spillway {

namespace {

using Kind = PickleValue::Kind;

std::string hex(std::uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), kDigits[value & 15]);
    value >>= 4;
  } while (value != 0);
  return "0x" + out;
}

// *total += delta; false when that overflows (sizes from a hostile file).
bool add_checked(std::int64_t* total, std::int64_t delta) {
  return !__builtin_add_overflow(*total, delta, total);
}
bool subtract_checked(std::int64_t* total, std::int64_t delta) {
  return !__builtin_sub_overflow(*total, delta, total);
}

// Byte counts and addresses above this are refused, so that rounding and
// negating them stays within 64 bits.
constexpr std::uint64_t kMaxByteCount = std::uint64_t{1} << 62;

// Reads typed fields of the snapshot's dicts; the first problem is kept in
// `error` with the path to the value.
class SnapshotFields {
 public:
  explicit SnapshotFields(const PickleDocument& doc) : doc_(doc) {}

  const std::string& error() const { return error_; }
  bool fail(const std::string& path, const std::string& what) {
    if (error_.empty()) error_ = path + ": " + what;
    return false;
  }

  bool expect(PickleRef ref, Kind kind, const std::string& path) {
    if (doc_.kind(ref) == kind) return true;
    return fail(path, "is " + std::string(PickleDocument::describe(doc_.kind(ref))) + ", not " +
                          std::string(PickleDocument::describe(kind)));
  }
  // dict[key], which must exist.
  bool field(PickleRef dict, std::string_view key, const std::string& path, PickleRef* out) {
    const PickleRef* found = doc_.find(dict, key);
    if (found == nullptr) return fail(path, "has no '" + std::string(key) + "'");
    *out = *found;
    return true;
  }
  bool integer(PickleRef dict, std::string_view key, const std::string& path, std::int64_t* out) {
    PickleRef ref;
    if (!field(dict, key, path, &ref)) return false;
    if (doc_.kind(ref) != Kind::integer)
      return fail(path, "'" + std::string(key) + "' is " +
                            std::string(PickleDocument::describe(doc_.kind(ref))) +
                            ", not an integer");
    *out = doc_.integer(ref);
    return true;
  }
  // A byte count or address: an integer >= 0.
  bool unsigned_integer(PickleRef dict, std::string_view key, const std::string& path,
                        std::uint64_t* out) {
    std::int64_t value;
    if (!integer(dict, key, path, &value)) return false;
    if (value < 0)
      return fail(path, "'" + std::string(key) + "' is negative (" + std::to_string(value) + ")");
    if (static_cast<std::uint64_t>(value) > kMaxByteCount)
      return fail(path,
                  "'" + std::string(key) + "' is larger than 2^62 (" + std::to_string(value) + ")");
    *out = static_cast<std::uint64_t>(value);
    return true;
  }
  // An optional integer: `fallback` when the key is absent.
  bool integer_or(PickleRef dict, std::string_view key, const std::string& path,
                  std::int64_t fallback, std::int64_t* out) {
    if (doc_.find(dict, key) == nullptr) {
      *out = fallback;
      return true;
    }
    return integer(dict, key, path, out);
  }
  bool string(PickleRef dict, std::string_view key, const std::string& path,
              std::string_view* out) {
    PickleRef ref;
    if (!field(dict, key, path, &ref)) return false;
    if (doc_.kind(ref) != Kind::string)
      return fail(path, "'" + std::string(key) + "' is " +
                            std::string(PickleDocument::describe(doc_.kind(ref))) +
                            ", not a string");
    *out = doc_.text(ref);
    return true;
  }

 private:
  const PickleDocument& doc_;
  std::string error_;
};

struct LiveBlock {
  std::uint64_t size;
  std::uint64_t location;
};

}  // namespace

std::uint64_t pytorch_rounded_size(std::uint64_t size) {
  constexpr std::uint64_t kRound = 512;
  return size < kRound ? kRound : (size + kRound - 1) / kRound * kRound;
}

AllocationTraceResult allocation_trace_from_snapshot(const PickleDocument& snapshot, int device,
                                                     const std::string& name) {
  AllocationTraceResult result;
  AllocationTrace& trace = result.trace;
  trace.format = AllocationTrace::Format::snapshot;
  trace.snapshot_device = device;
  SnapshotFields fields(snapshot);
  auto fail = [&]() -> AllocationTraceResult {
    result.trace = AllocationTrace{};
    result.error = name + ": " + fields.error();
    return result;
  };

  const PickleRef root = snapshot.root();
  if (snapshot.kind(root) == Kind::list) {
    fields.fail("the pickle",
                "is a list, not a snapshot dict (torch.cuda.memory_snapshot()'s "
                "segment list has no history; record one with "
                "torch.cuda.memory._record_memory_history() and save it with "
                "torch.cuda.memory._dump_snapshot())");
    return fail();
  }
  if (!fields.expect(root, Kind::dict, "the pickle")) return fail();
  PickleRef traces_ref, segments_ref;
  if (!fields.field(root, "device_traces", "the snapshot", &traces_ref) ||
      !fields.expect(traces_ref, Kind::list, "device_traces") ||
      !fields.field(root, "segments", "the snapshot", &segments_ref) ||
      !fields.expect(segments_ref, Kind::list, "segments"))
    return fail();
  const std::vector<PickleRef>& device_traces = snapshot.items(traces_ref);
  if (device < 0 || static_cast<std::size_t>(device) >= device_traces.size()) {
    fields.fail("device_traces", "has no trace for device " + std::to_string(device) + " (it has " +
                                     std::to_string(device_traces.size()) + ")");
    return fail();
  }
  const std::string trace_path = "device_traces[" + std::to_string(device) + "]";
  const PickleRef entries_ref = device_traces[static_cast<std::size_t>(device)];
  if (!fields.expect(entries_ref, Kind::list, trace_path)) return fail();
  const std::vector<PickleRef>& entries = snapshot.items(entries_ref);
  trace.snapshot_entries = entries.size();
  auto entry_path = [&](std::size_t k) { return trace_path + "[" + std::to_string(k) + "]"; };
  auto overflow = [&](const std::string& path) {
    fields.fail(path, "the byte counts add up to more than 64 bits hold");
    return fail();
  };
  auto rounded = [](std::uint64_t size) {
    return static_cast<std::int64_t>(pytorch_rounded_size(size));
  };

  // Every entry is a dict with an action; which free to replay depends on
  // whether the history has completed frees at all (Note [Snapshot to trace]).
  std::vector<std::string_view> actions(entries.size());
  bool has_free_completed = false;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    if (!fields.expect(entries[k], Kind::dict, entry_path(k)) ||
        !fields.string(entries[k], "action", entry_path(k), &actions[k]))
      return fail();
    has_free_completed = has_free_completed || actions[k] == "free_completed";
  }
  const std::string_view free_action = has_free_completed ? "free_completed" : "free_requested";

  std::vector<AllocationEvent> freed_before_trace;  // live before the trace, freed in it
  std::vector<AllocationEvent> body;
  std::unordered_map<std::uint64_t, LiveBlock> live;  // address -> block, per the trace
  std::unordered_set<std::uint64_t> seen;             // addresses the trace allocates or frees
  // Changes since the trace began, and their extremes (Note [The native
  // figure from a snapshot]).
  std::int64_t reserved_change = 0, max_reserved_change = 0, min_reserved_change = 0;
  std::int64_t allocated_change = 0, max_allocated_change = 0;
  std::int64_t allocated_before_trace = 0;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const PickleRef entry = entries[k];
    const std::string_view action = actions[k];
    const bool is_alloc = action == "alloc";
    if (is_alloc || action == free_action) {
      AllocationEvent event;
      std::int64_t stream, time_us;
      if (!fields.unsigned_integer(entry, "addr", entry_path(k), &event.address) ||
          !fields.unsigned_integer(entry, "size", entry_path(k), &event.size) ||
          !fields.integer_or(entry, "stream", entry_path(k), 0, &stream) ||
          !fields.integer_or(entry, "time_us", entry_path(k), 0, &time_us))
        return fail();
      event.stream = static_cast<std::uint64_t>(stream);
      event.time_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(time_us, 0)) * 1000;
      event.location = k;
      const auto it = live.find(event.address);
      if (is_alloc) {
        if (it != live.end()) {
          fields.fail(entry_path(k), "alloc of address " + hex(event.address) +
                                         ", which is still live (allocated at " +
                                         trace.where({.location = it->second.location}) + ")");
          return fail();
        }
        event.kind = AllocationEvent::Kind::alloc;
        live.emplace(event.address, LiveBlock{event.size, k});
        if (!add_checked(&allocated_change, rounded(event.size))) return overflow(entry_path(k));
        max_allocated_change = std::max(max_allocated_change, allocated_change);
      } else {
        event.kind = AllocationEvent::Kind::free;
        if (it != live.end()) {
          if (!subtract_checked(&allocated_change, rounded(it->second.size)))
            return overflow(entry_path(k));
          live.erase(it);
        } else if (!seen.contains(event.address)) {
          // Allocated before the history began.
          AllocationEvent alloc = event;
          alloc.kind = AllocationEvent::Kind::alloc;
          freed_before_trace.push_back(alloc);
          if (!add_checked(&allocated_before_trace, rounded(event.size)) ||
              !subtract_checked(&allocated_change, rounded(event.size)))
            return overflow(entry_path(k));
        } else {
          fields.fail(entry_path(k), std::string(free_action) + " of address " +
                                         hex(event.address) +
                                         ", which the trace has already freed");
          return fail();
        }
      }
      seen.insert(event.address);
      body.push_back(event);
    } else if (action == "segment_alloc" || action == "segment_map" || action == "segment_free" ||
               action == "segment_unmap") {
      std::uint64_t size;
      if (!fields.unsigned_integer(entry, "size", entry_path(k), &size)) return fail();
      const bool grows = action == "segment_alloc" || action == "segment_map";
      const auto delta = static_cast<std::int64_t>(size);
      if (!add_checked(&reserved_change, grows ? delta : -delta)) return overflow(entry_path(k));
      max_reserved_change = std::max(max_reserved_change, reserved_change);
      min_reserved_change = std::min(min_reserved_change, reserved_change);
      // Note [Cache releases in a snapshot]: one release per run of them.
      const bool releases = action == "segment_free" || action == "segment_unmap";
      if (releases && (body.empty() || body.back().kind != AllocationEvent::Kind::release_cache)) {
        std::int64_t time_us;
        if (!fields.integer_or(entry, "time_us", entry_path(k), 0, &time_us)) return fail();
        AllocationEvent release;
        release.kind = AllocationEvent::Kind::release_cache;
        release.time_ns = static_cast<std::uint64_t>(std::max<std::int64_t>(time_us, 0)) * 1000;
        release.location = k;
        body.push_back(release);
      }
    } else if (action == "oom") {
      ++trace.recorded_ooms;
    }
    // free_requested (when completed frees are replayed), snapshot and any
    // newer action: nothing to replay.
  }

  // The segments: reserved bytes at the end, and blocks live since before
  // the trace.
  const std::vector<PickleRef>& segments = snapshot.items(segments_ref);
  std::int64_t reserved_at_end = 0;
  std::vector<AllocationEvent> live_before_trace;
  // The first alloc or free's time (a cache release may come first).
  const auto first_block_event = std::find_if(body.begin(), body.end(), [](const auto& event) {
    return event.kind != AllocationEvent::Kind::release_cache;
  });
  const std::uint64_t first_time_ns =
      first_block_event == body.end() ? 0 : first_block_event->time_ns;
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::string path = "segments[" + std::to_string(s) + "]";
    const PickleRef segment = segments[s];
    std::int64_t segment_device, stream;
    std::uint64_t total_size;
    PickleRef blocks_ref;
    if (!fields.expect(segment, Kind::dict, path) ||
        !fields.integer_or(segment, "device", path, device, &segment_device))
      return fail();
    if (segment_device != device) continue;
    if (!fields.unsigned_integer(segment, "total_size", path, &total_size) ||
        !fields.integer_or(segment, "stream", path, 0, &stream) ||
        !fields.field(segment, "blocks", path, &blocks_ref) ||
        !fields.expect(blocks_ref, Kind::list, path + "['blocks']"))
      return fail();
    if (!add_checked(&reserved_at_end, static_cast<std::int64_t>(total_size)))
      return overflow(path);
    const std::vector<PickleRef>& blocks = snapshot.items(blocks_ref);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const std::string block_path = path + "['blocks'][" + std::to_string(b) + "]";
      std::string_view state;
      if (!fields.expect(blocks[b], Kind::dict, block_path) ||
          !fields.string(blocks[b], "state", block_path, &state))
        return fail();
      if (!state.starts_with("active")) continue;  // "inactive": cached, free
      AllocationEvent event;
      std::int64_t requested;
      if (!fields.unsigned_integer(blocks[b], "address", block_path, &event.address) ||
          !fields.unsigned_integer(blocks[b], "size", block_path, &event.size) ||
          !fields.integer_or(blocks[b], "requested_size", block_path,
                             static_cast<std::int64_t>(event.size), &requested))
        return fail();
      // What was asked for fits in the block that served it.
      if (requested < 0 || static_cast<std::uint64_t>(requested) > event.size) {
        fields.fail(block_path, "requested_size " + std::to_string(requested) +
                                    " is outside 0 to the block's size, " +
                                    std::to_string(event.size));
        return fail();
      }
      if (seen.contains(event.address)) continue;  // the trace has its story
      if (requested > 0) event.size = static_cast<std::uint64_t>(requested);
      event.kind = AllocationEvent::Kind::alloc;
      event.stream = static_cast<std::uint64_t>(stream);
      event.time_ns = first_time_ns;
      event.location = entries.size() + live_before_trace.size();
      if (!add_checked(&allocated_before_trace, rounded(event.size))) return overflow(block_path);
      live_before_trace.push_back(event);
    }
  }

  std::int64_t reserved_at_start = reserved_at_end;
  bool fits = subtract_checked(&reserved_at_start, reserved_change);
  std::int64_t lowest = reserved_at_start, peak_reserved = reserved_at_start;
  std::int64_t peak_allocated = allocated_before_trace;
  fits = fits && add_checked(&lowest, min_reserved_change) &&
         add_checked(&peak_reserved, max_reserved_change) &&
         add_checked(&peak_allocated, max_allocated_change);
  if (!fits) return overflow(trace_path);
  if (lowest < 0) {
    fields.fail(trace_path, "its segment entries return " + std::to_string(-lowest) +
                                " bytes more than the segments held (the segments hold " +
                                std::to_string(reserved_at_end) + " bytes at the end)");
    return fail();
  }
  trace.recorded_peak_reserved_bytes = static_cast<std::uint64_t>(peak_reserved);
  trace.recorded_peak_allocated_bytes = static_cast<std::uint64_t>(peak_allocated);

  for (AllocationEvent& event : freed_before_trace) event.time_ns = first_time_ns;
  trace.blocks_live_before_trace = freed_before_trace.size() + live_before_trace.size();
  trace.events.reserve(trace.blocks_live_before_trace + body.size());
  trace.events.insert(trace.events.end(), freed_before_trace.begin(), freed_before_trace.end());
  trace.events.insert(trace.events.end(), live_before_trace.begin(), live_before_trace.end());
  trace.events.insert(trace.events.end(), body.begin(), body.end());
  return result;
}

}  // namespace spillway
