// PyTorch memory snapshots as allocation traces (Note [Snapshot to trace],
// Note [The native figure from a snapshot]): small snapshots built byte by
// byte here, and the ones tools/tracegen/make_snapshots.py writes from its
// model of PyTorch's caching allocator, checked against what that script
// computed from the model itself.
#include "tools/replay/memory_snapshot.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/replay/pickle_test_encoder.h"
#include "tools/replay/allocation_replay.h"
#include "tools/replay/allocation_trace.h"

namespace spillway {
namespace {

using Kind = AllocationEvent::Kind;
using namespace test_pickle;

constexpr std::int64_t kMiB = 1 << 20;

std::string entry(std::string_view action, std::int64_t addr, std::int64_t size,
                  std::int64_t stream = 0, std::int64_t time_us = 0) {
  return dict({str("action"), str(action), str("addr"), integer(addr), str("size"), integer(size),
               str("stream"), integer(stream), str("time_us"), integer(time_us), str("frames"),
               list({})});
}

std::string block(std::int64_t address, std::int64_t size, std::int64_t requested,
                  std::string_view state) {
  return dict({str("address"), integer(address), str("size"), integer(size), str("requested_size"),
               integer(requested), str("state"), str(state)});
}

std::string segment(std::int64_t address, std::int64_t total, std::int64_t stream,
                    const std::string& blocks, std::int64_t device = 0) {
  return dict({str("device"), integer(device), str("address"), integer(address), str("total_size"),
               integer(total), str("stream"), integer(stream), str("blocks"), blocks});
}

AllocationTraceResult convert(const std::string& snapshot_pickle, int device = 0) {
  const PickleReadResult read = read_pickle(snapshot_pickle);
  EXPECT_TRUE(read.ok()) << read.error;
  return allocation_trace_from_snapshot(read.document, device, "s.pickle");
}

// One 20 MiB segment reserved before the history (holding block A, live
// since then, and B, freed in the history), one 2 MiB segment allocated and
// freed in it, and C allocated and freed on a side stream.
TEST(replay_Snapshot, EventsComeInOrderWithBlocksLiveBeforeTheTraceFirst) {
  constexpr std::int64_t kSeg = 0x7f0000000000, kA = kSeg, kB = kSeg + 4 * kMiB;
  constexpr std::int64_t kSmall = 0x7f0100000000, kC = kSmall;
  constexpr std::int64_t kSide = 0x5555;
  const std::string snapshot = pickle(dict({
      str("segments"),
      list({segment(kSeg, 20 * kMiB, 0,
                    list({block(kA, 4 * kMiB, 4 * kMiB - 100, "active_allocated"),
                          block(kB, 16 * kMiB, 0, "inactive")}))}),
      str("device_traces"),
      list({list({
          entry("free_requested", kB, 3 * kMiB, 0, 10),
          entry("free_completed", kB, 3 * kMiB, 0, 11),
          entry("segment_alloc", kSmall, 2 * kMiB, kSide, 12),
          entry("alloc", kC, 1000, kSide, 13),
          entry("free_requested", kC, 1000, kSide, 14),
          entry("oom", 0, 1 << 30, 0, 15),
          entry("free_completed", kC, 1000, kSide, 16),
          entry("segment_free", kSmall, 2 * kMiB, kSide, 17),
          entry("snapshot", 0, 0, 0, 18),
      })}),
  }));
  const AllocationTraceResult result = convert(snapshot);
  ASSERT_TRUE(result.ok()) << result.error;
  const AllocationTrace& trace = result.trace;
  EXPECT_EQ(trace.format, AllocationTrace::Format::snapshot);
  EXPECT_EQ(trace.snapshot_entries, 9u);
  EXPECT_EQ(trace.blocks_live_before_trace, 2u);
  ASSERT_EQ(trace.events.size(), 6u);
  // B (freed in the history) first, then A (live in the segments), both at
  // the first replayed event's time.
  const AllocationEvent& b = trace.events[0];
  EXPECT_EQ(b.kind, Kind::alloc);
  EXPECT_EQ(b.address, static_cast<std::uint64_t>(kB));
  EXPECT_EQ(b.size, 3u * kMiB);
  EXPECT_EQ(b.time_ns, 11'000u);
  EXPECT_EQ(trace.where(b), "device_traces[0][1]");
  const AllocationEvent& a = trace.events[1];
  EXPECT_EQ(a.kind, Kind::alloc);
  EXPECT_EQ(a.address, static_cast<std::uint64_t>(kA));
  EXPECT_EQ(a.size, 4u * kMiB - 100);  // the requested size
  EXPECT_EQ(trace.where(a), "live block 0 of the snapshot's segments");
  // Then the history: the completed frees, streams and times kept.
  EXPECT_EQ(trace.events[2].kind, Kind::free);
  EXPECT_EQ(trace.events[2].address, static_cast<std::uint64_t>(kB));
  EXPECT_EQ(trace.events[3].kind, Kind::alloc);
  EXPECT_EQ(trace.events[3].stream, static_cast<std::uint64_t>(kSide));
  EXPECT_EQ(trace.events[3].time_ns, 13'000u);
  EXPECT_EQ(trace.events[4].kind, Kind::free);
  EXPECT_EQ(trace.events[4].time_ns, 16'000u);
  EXPECT_EQ(trace.where(trace.events[4]), "device_traces[0][6]");
  // The segment PyTorch gave back: the program emptied the cache there
  // (Note [Cache releases in a snapshot]).
  EXPECT_EQ(trace.events[5].kind, Kind::release_cache);
  EXPECT_EQ(trace.events[5].time_ns, 17'000u);
  EXPECT_EQ(trace.where(trace.events[5]), "device_traces[0][7]");
  // Reserved: 20 MiB at the end, so 20 at the start, 22 at the peak.
  // Allocated: A and B (rounded) at the start is the peak.
  EXPECT_EQ(trace.recorded_peak_reserved_bytes, 22u * kMiB);
  EXPECT_EQ(trace.recorded_peak_allocated_bytes, 4u * kMiB + 3u * kMiB);
  EXPECT_EQ(trace.recorded_ooms, 1u);

  // Every free of the replay finds its block.
  ReplayResult replay;
  std::string error;
  ASSERT_TRUE(replay_allocations(trace, {}, &replay, &error)) << error;
  EXPECT_EQ(replay.unmatched_frees, 0u);
  EXPECT_EQ(replay.allocs, 3u);
  EXPECT_EQ(replay.cache_releases, 1u);
}

TEST(replay_Snapshot, WithoutCompletedFreesTheRequestedOnesAreReplayed) {
  const std::string snapshot = pickle(dict({
      str("segments"),
      list({}),
      str("device_traces"),
      list({list({entry("segment_alloc", 0x1000, 2 * kMiB), entry("alloc", 0x1000, 100),
                  entry("free_requested", 0x1000, 100), entry("alloc", 0x1000, 700)})}),
  }));
  const AllocationTraceResult result = convert(snapshot);
  // The segment list is empty at the end although a segment was allocated.
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("s.pickle: device_traces[0]: its segment entries return"),
            std::string::npos)
      << result.error;

  const std::string consistent = pickle(dict({
      str("segments"),
      list({segment(0x1000, 2 * kMiB, 0, list({block(0x1000, 1024, 700, "active_allocated")}))}),
      str("device_traces"),
      list({list({entry("segment_alloc", 0x1000, 2 * kMiB), entry("alloc", 0x1000, 100),
                  entry("free_requested", 0x1000, 100), entry("alloc", 0x1000, 700)})}),
  }));
  const AllocationTraceResult ok = convert(consistent);
  ASSERT_TRUE(ok.ok()) << ok.error;
  ASSERT_EQ(ok.trace.events.size(), 3u);
  EXPECT_EQ(ok.trace.events[1].kind, Kind::free);
  EXPECT_EQ(ok.trace.events[2].size, 700u);
  EXPECT_EQ(ok.trace.blocks_live_before_trace, 0u);
  EXPECT_EQ(ok.trace.recorded_peak_reserved_bytes, 2u * kMiB);
  EXPECT_EQ(ok.trace.recorded_peak_allocated_bytes, 1024u);  // 700 rounded to 512s
}

TEST(replay_Snapshot, ChoosesTheDevice) {
  const std::string snapshot = pickle(dict({
      str("segments"),
      list({segment(0x1000, 2 * kMiB, 0, list({block(0x1000, 512, 10, "active_allocated")}), 0),
            segment(0x9000, 20 * kMiB, 0, list({}), 1)}),
      str("device_traces"),
      list({list({}), list({entry("alloc", 0x9000, 5 * kMiB)})}),
  }));
  const AllocationTraceResult zero = convert(snapshot, 0);
  ASSERT_TRUE(zero.ok()) << zero.error;
  ASSERT_EQ(zero.trace.events.size(), 1u);  // device 0's live block only
  EXPECT_EQ(zero.trace.recorded_peak_reserved_bytes, 2u * kMiB);
  const AllocationTraceResult one = convert(snapshot, 1);
  ASSERT_TRUE(one.ok()) << one.error;
  ASSERT_EQ(one.trace.events.size(), 1u);
  EXPECT_EQ(one.trace.events[0].address, 0x9000u);
  EXPECT_EQ(one.trace.recorded_peak_reserved_bytes, 20u * kMiB);
  EXPECT_EQ(one.trace.where(one.trace.events[0]), "device_traces[1][0]");
  const AllocationTraceResult two = convert(snapshot, 2);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.error.find("device_traces: has no trace for device 2 (it has 2)"),
            std::string::npos)
      << two.error;
}

TEST(replay_Snapshot, BadSnapshotsAreRejectedWithThePath) {
  struct Case {
    std::string value;
    const char* error;
  };
  const Case cases[] = {
      {list({}), "s.pickle: the pickle: is a list, not a snapshot dict"},
      {integer(3), "s.pickle: the pickle: is an integer, not a dict"},
      {dict({str("segments"), list({})}), "the snapshot: has no 'device_traces'"},
      {dict({str("device_traces"), dict({}), str("segments"), list({})}),
       "device_traces: is a dict, not a list"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({dict({str("action"), str("alloc"), str("addr"), integer(1), str("size"),
                               str("big")})})})}),
       "device_traces[0][0]: 'size' is a string, not an integer"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({entry("alloc", 0x10, 5), entry("alloc", 0x10, 6)})})}),
       "device_traces[0][1]: alloc of address 0x10, which is still live (allocated at "
       "device_traces[0][0])"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({entry("alloc", 0x10, 5), entry("free_completed", 0x10, 5),
                         entry("free_completed", 0x10, 5)})})}),
       "device_traces[0][2]: free_completed of address 0x10, which the trace has already freed"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({entry("alloc", -5, 5)})})}),
       "device_traces[0][0]: 'addr' is negative (-5)"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({entry("alloc", 0x10, (std::int64_t{1} << 62) + 1)})})}),
       "device_traces[0][0]: 'size' is larger than 2^62"},
      {dict({str("segments"), list({}), str("device_traces"),
             list({list({entry("segment_alloc", 0x10, std::int64_t{1} << 62),
                         entry("segment_alloc", 0x20, std::int64_t{1} << 62)})})}),
       "device_traces[0][1]: the byte counts add up to more than 64 bits hold"},
      {dict({str("segments"), list({integer(1)}), str("device_traces"), list({list({})})}),
       "segments[0]: is an integer, not a dict"},
      {dict({str("segments"),
             list({segment(0, 512, 0, list({dict({str("state"), str("active_allocated")})}))}),
             str("device_traces"), list({list({})})}),
       "segments[0]['blocks'][0]: has no 'address'"},
      {dict({str("segments"),
             list({segment(0, 512, 0,
                           list({block(0, 512, std::int64_t{1} << 62, "active_allocated")}))}),
             str("device_traces"), list({list({})})}),
       "segments[0]['blocks'][0]: requested_size 4611686018427387904 is outside 0 to the "
       "block's size, 512"},
      {dict({str("segments"),
             list({segment(0, 512, 0, list({block(0, 512, -1, "active_allocated")}))}),
             str("device_traces"), list({list({})})}),
       "segments[0]['blocks'][0]: requested_size -1 is outside 0"},
  };
  for (const Case& c : cases) {
    const AllocationTraceResult result = convert(pickle(c.value));
    ASSERT_FALSE(result.ok()) << c.error;
    EXPECT_NE(result.error.find(c.error), std::string::npos)
        << result.error << "\nexpected: " << c.error;
  }
}

TEST(replay_Snapshot, PyTorchRounding) {
  EXPECT_EQ(pytorch_rounded_size(1), 512u);
  EXPECT_EQ(pytorch_rounded_size(512), 512u);
  EXPECT_EQ(pytorch_rounded_size(513), 1024u);
  EXPECT_EQ(pytorch_rounded_size(3 * kMiB + 1), 3u * kMiB + 512);
}

// ---- snapshots from tools/tracegen/make_snapshots.py ----

class replay_GeneratedSnapshot : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#ifdef SPILLWAY_TRACEGEN_PYTHON
    dir_ = std::filesystem::temp_directory_path() /
           ("spillway_snapshots_" + std::to_string(::getpid()));
    const std::string command = std::string(SPILLWAY_TRACEGEN_PYTHON) + " " +
                                SPILLWAY_SOURCE_DIR "/tools/tracegen/make_snapshots.py --out " +
                                dir_.string() + " 2>/dev/null";
    generated_ = std::system(command.c_str()) == 0;
#endif
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
#ifndef SPILLWAY_TRACEGEN_PYTHON
    GTEST_SKIP() << "no python3 at configure time";
#endif
    ASSERT_TRUE(generated_) << "make_snapshots.py failed";
  }

  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static std::map<std::string, std::uint64_t> expected(const std::string& name) {
    std::map<std::string, std::uint64_t> keys;
    std::ifstream in(path(name + ".expected"));
    std::string key;
    std::uint64_t value;
    while (in >> key >> value) keys[key] = value;
    return keys;
  }

  // The snapshot's events and figures are exactly what the script computed
  // from its allocator model.
  static void check(const std::string& snapshot, const std::string& name, int device = 0) {
    SCOPED_TRACE(name);
    const AllocationTraceResult loaded =
        load_allocation_trace(path(snapshot), TraceLoadOptions{.snapshot_device = device});
    ASSERT_TRUE(loaded.ok()) << loaded.error;
    const AllocationTraceResult want = load_allocation_trace(path(name + ".events.csv"));
    ASSERT_TRUE(want.ok()) << want.error;
    const AllocationTrace& trace = loaded.trace;
    EXPECT_EQ(trace.format, AllocationTrace::Format::snapshot);
    ASSERT_EQ(trace.events.size(), want.trace.events.size());
    std::uint64_t allocs = 0, frees = 0, releases = 0;
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const AllocationEvent& got = trace.events[i];
      const AllocationEvent& e = want.trace.events[i];
      ASSERT_TRUE(got.kind == e.kind && got.address == e.address && got.size == e.size &&
                  got.stream == e.stream && got.time_ns == e.time_ns)
          << "event " << i << " (" << trace.where(got) << ") differs from " << want.trace.where(e)
          << " of " << name << ".events.csv";
      allocs += got.kind == Kind::alloc;
      frees += got.kind == Kind::free;
      releases += got.kind == Kind::release_cache;
    }
    const auto keys = expected(name);
    ASSERT_FALSE(keys.empty());
    EXPECT_EQ(trace.snapshot_entries, keys.at("entries"));
    EXPECT_EQ(allocs, keys.at("allocs"));
    EXPECT_EQ(frees, keys.at("frees"));
    EXPECT_EQ(releases, keys.at("cache_releases"));
    EXPECT_EQ(trace.blocks_live_before_trace, keys.at("blocks_live_before_trace"));
    EXPECT_EQ(trace.recorded_peak_reserved_bytes, keys.at("native_peak_reserved_bytes"));
    EXPECT_EQ(trace.recorded_peak_allocated_bytes, keys.at("native_peak_allocated_bytes"));
    EXPECT_EQ(trace.recorded_ooms, keys.at("ooms"));

    ReplayResult replay;
    std::string error;
    ASSERT_TRUE(replay_allocations(trace, {}, &replay, &error)) << error;
    EXPECT_EQ(replay.unmatched_frees, 0u);
    EXPECT_EQ(replay.failed_allocs, 0u);
    EXPECT_EQ(replay.cache_releases, releases);
  }

  static inline std::filesystem::path dir_;
  static inline bool generated_ = false;
};

TEST_F(replay_GeneratedSnapshot, TransformerTrainingRun) {
  check("transformer_train.pickle", "transformer_train");
  const auto keys = expected("transformer_train");
  EXPECT_GT(keys.at("native_peak_reserved_bytes"), keys.at("native_peak_allocated_bytes"));
}

TEST_F(replay_GeneratedSnapshot, HistoryThatBeganMidRun) {
  check("mid_run.pickle", "mid_run");
  EXPECT_GT(expected("mid_run").at("blocks_live_before_trace"), 0u);
}

TEST_F(replay_GeneratedSnapshot, Protocol2) { check("mid_run_p2.pickle", "mid_run_p2"); }

TEST_F(replay_GeneratedSnapshot, SecondDevice) { check("mid_run.pickle", "mid_run.device1", 1); }

TEST_F(replay_GeneratedSnapshot, RecordedWithoutCompletedFrees) {
  check("mid_run_no_completed.pickle", "mid_run_no_completed");
}

TEST_F(replay_GeneratedSnapshot, TruncatedFileNamesTheOpcodeTheCutFallsIn) {
  const auto keys = expected("truncated");
  const AllocationTraceResult result = load_allocation_trace(path("truncated.pickle"));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("truncated.pickle: byte offset " +
                              std::to_string(keys.at("error_offset")) + ": "),
            std::string::npos)
      << result.error;
  EXPECT_NE(
      result.error.find("the file has " + std::to_string(keys.at("file_size")) + "; truncated?"),
      std::string::npos)
      << result.error;
}

TEST_F(replay_GeneratedSnapshot, ClassReferenceIsRefused) {
  const auto keys = expected("class_reference");
  const AllocationTraceResult result = load_allocation_trace(path("class_reference.pickle"));
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.error.find("class_reference.pickle: byte offset " +
                              std::to_string(keys.at("error_offset")) +
                              ": STACK_GLOBAL (opcode 0x93) names collections.OrderedDict"),
            std::string::npos)
      << result.error;
}

}  // namespace
}  // namespace spillway
