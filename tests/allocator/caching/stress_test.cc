// Many threads allocating, writing, checking and freeing at once, on several
// streams, under a budget tight enough to hit the fallback chain. Each block
// is filled with a pattern unique to its allocation and checked before it is
// freed, and live ranges are checked for overlap as they are handed out, so
// two callers sharing memory is caught. Meant to run under TSan and ASan too.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "allocator/caching/caching_allocator.h"
#include "allocator/caching/pressure_handler.h"
#include "allocator/device/sim_device.h"
#include "allocator_test_support.h"

namespace spillway::testing {
namespace {

// Every range handed out and not yet freed; overlap means a broken allocator.
class LiveRanges {
 public:
  bool add(std::uintptr_t begin, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    const std::uintptr_t end = begin + bytes;
    auto after = ranges_.lower_bound(begin);
    if (after != ranges_.end() && after->first < end) return false;
    if (after != ranges_.begin() && std::prev(after)->second > begin) return false;
    ranges_.emplace(begin, end);
    return true;
  }
  void remove(std::uintptr_t begin) {
    std::lock_guard lock(mutex_);
    ranges_.erase(begin);
  }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::uintptr_t> ranges_;
};

struct LiveBlock {
  void* ptr;
  std::size_t bytes;
  std::uint64_t pattern;
};

// Blocks up to 64 KiB are written and checked in full; larger ones in their
// first and last 4 KiB and one word in every 4 KiB between (enough to catch
// an overlap, which the LiveRanges check catches anyway, at sanitizer speed).
constexpr std::size_t kFullCheckBytes = 64 * KiB;
constexpr std::size_t kWordsPer4KiB = 4 * KiB / 8;

template <typename Visit>
void for_each_checked_word(const LiveBlock& block, Visit&& visit) {
  const std::size_t words = block.bytes / 8;
  if (block.bytes <= kFullCheckBytes) {
    for (std::size_t i = 0; i < words; ++i) visit(i);
    return;
  }
  for (std::size_t i = 0; i < kWordsPer4KiB; ++i) visit(i);
  for (std::size_t i = kWordsPer4KiB; i + kWordsPer4KiB < words; i += kWordsPer4KiB) visit(i);
  for (std::size_t i = words - kWordsPer4KiB; i < words; ++i) visit(i);
}

void fill(const LiveBlock& block) {
  auto* words = static_cast<std::uint64_t*>(block.ptr);
  for_each_checked_word(block, [&](std::size_t i) { words[i] = block.pattern + i; });
  std::memset(static_cast<char*>(block.ptr) + block.bytes / 8 * 8,
              static_cast<int>(block.pattern & 0xFF), block.bytes % 8);
}

bool intact(const LiveBlock& block) {
  const auto* words = static_cast<const std::uint64_t*>(block.ptr);
  bool ok = true;
  for_each_checked_word(block, [&](std::size_t i) { ok = ok && words[i] == block.pattern + i; });
  const auto* tail = static_cast<const unsigned char*>(block.ptr) + block.bytes / 8 * 8;
  for (std::size_t i = 0; i < block.bytes % 8; ++i) {
    if (tail[i] != (block.pattern & 0xFF)) return false;
  }
  return ok;
}

// Blocks threads park here; under pressure it frees them, from whichever
// thread the allocator runs it on.
class SharedParking final : public PressureHandler {
 public:
  SharedParking(CachingAllocator& allocator, LiveRanges& ranges)
      : allocator_(allocator), ranges_(ranges) {}

  void park(const LiveBlock& block) {
    std::lock_guard lock(mutex_);
    parked_.push_back(block);
  }
  std::size_t relieve_pressure(std::size_t bytes, Stream) override {
    std::lock_guard lock(mutex_);
    std::size_t freed = 0;
    while (freed < bytes && !parked_.empty()) {
      const LiveBlock block = parked_.back();
      parked_.pop_back();
      if (!intact(block)) corrupted_.fetch_add(1);
      ranges_.remove(reinterpret_cast<std::uintptr_t>(block.ptr));
      if (allocator_.deallocate(block.ptr) != Status::ok) corrupted_.fetch_add(1);
      freed += block.bytes;
    }
    calls_.fetch_add(1);
    return freed;
  }
  std::string describe_holdings() const override {
    std::lock_guard lock(mutex_);
    return "parking: " + std::to_string(parked_.size()) + " blocks";
  }
  void release_all() { relieve_pressure(~std::size_t{0}, {}); }
  int corrupted() const { return corrupted_.load(); }
  int calls() const { return calls_.load(); }

 private:
  CachingAllocator& allocator_;
  LiveRanges& ranges_;
  mutable std::mutex mutex_;
  std::vector<LiveBlock> parked_;
  std::atomic<int> corrupted_{0};
  std::atomic<int> calls_{0};
};

TEST(CachingAllocatorStress, ThreadsNeverShareMemory) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 6000;
  SimDevice device(sim_options(512 * MiB));
  CachingAllocator allocator(device, allocator_options(64 * MiB, 8 * MiB));
  Stream streams[3];
  for (Stream& stream : streams) ASSERT_EQ(device.create_stream(&stream), Status::ok);
  LiveRanges ranges;
  SharedParking parking(allocator, ranges);
  allocator.add_pressure_handler(&parking);

  std::atomic<int> overlaps{0}, corrupted{0}, failed_frees{0}, ooms{0}, other_errors{0};
  std::atomic<std::uint64_t> next_pattern{1};

  auto worker = [&](int thread_index) {
    std::mt19937_64 rng(977 * thread_index + 1);
    std::vector<LiveBlock> live;
    auto free_one = [&](std::size_t index) {
      const LiveBlock block = live[index];
      if (!intact(block)) corrupted.fetch_add(1);
      ranges.remove(reinterpret_cast<std::uintptr_t>(block.ptr));
      if (rng() % 10 == 0) {  // used on another stream too: a deferred free
        allocator.record_stream(block.ptr, streams[rng() % 3]);
      }
      if (allocator.deallocate(block.ptr) != Status::ok) failed_frees.fetch_add(1);
      live[index] = live.back();
      live.pop_back();
    };
    for (int op = 0; op < kOpsPerThread; ++op) {
      if (live.size() < 24 && (live.empty() || rng() % 100 < 55)) {
        std::size_t bytes;
        const auto kind = rng() % 100;
        if (kind < 85) {
          bytes = 1 + rng() % (64 * KiB);
        } else if (kind < 98) {
          bytes = 1 * MiB + rng() % (3 * MiB);
        } else {
          bytes = 9 * MiB + rng() % (3 * MiB);
        }
        const Stream stream = rng() % 4 == 0 ? Stream{} : streams[rng() % 3];
        void* ptr = nullptr;
        const Status status = allocator.allocate(&ptr, bytes, stream);
        if (status == Status::out_of_memory) {
          ooms.fetch_add(1);
          if (!live.empty()) free_one(rng() % live.size());
          continue;
        }
        if (status != Status::ok || ptr == nullptr) {
          other_errors.fetch_add(1);
          continue;
        }
        if (!ranges.add(reinterpret_cast<std::uintptr_t>(ptr), bytes)) overlaps.fetch_add(1);
        const LiveBlock block{ptr, bytes, next_pattern.fetch_add(1) << 20};
        fill(block);
        if (rng() % 50 == 0) {
          parking.park(block);
        } else {
          live.push_back(block);
        }
      } else if (!live.empty()) {
        free_one(rng() % live.size());
      }
      if (rng() % 997 == 0) allocator.empty_cache();
      if (rng() % 499 == 0) allocator.reset_peak_stats();
      if (rng() % 101 == 0) (void)allocator.stats();
    }
    while (!live.empty()) free_one(live.size() - 1);
  };

  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (std::thread& thread : threads) thread.join();
  parking.release_all();
  allocator.remove_pressure_handler(&parking);

  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(parking.corrupted(), 0);
  EXPECT_EQ(failed_frees.load(), 0);
  EXPECT_EQ(other_errors.load(), 0);

  ASSERT_EQ(device.synchronize(), Status::ok);
  allocator.empty_cache();
  const Stats stats = allocator.stats();
  EXPECT_EQ(stats.allocation.current, 0);
  EXPECT_EQ(stats.allocation.allocated, stats.allocation.freed);
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.active_bytes.current, 0);
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_LE(stats.reserved_bytes.peak, static_cast<std::int64_t>(64 * MiB));
  EXPECT_EQ(stats.num_ooms, ooms.load());
  EXPECT_EQ(device.used_bytes(), 0u);
  // Report how hard the chain was pushed (not asserted: scheduling decides).
  std::printf("stress: %lld allocations, %d out-of-memories, %lld retries, %d handler calls\n",
              static_cast<long long>(stats.allocation.allocated), ooms.load(),
              static_cast<long long>(stats.num_alloc_retries), parking.calls());
}

}  // namespace
}  // namespace spillway::testing
