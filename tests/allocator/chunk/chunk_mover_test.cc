// ChunkMover alone, on the simulated device: payloads are plain device
// blocks and host buffers, with no clients, tensors or policies. Each
// ordering of Notes [Two copy streams], [Streams and chunk payloads] and
// [Reuse fences] is tested with the work it must follow held back by a
// StreamGate, so a missing event wait moves the wrong bytes every time,
// and copies are delayed, so a wait that is there but too early shows too.
#include "allocator/chunk/chunk_mover.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "allocator/device/sim_device.h"
#include "tests/allocator/chunk/chunk_test_support.h"
#include "tests/allocator/device/stream_gate.h"

namespace spillway::testing {
namespace {

constexpr std::size_t kBlockBytes = 256 * 1024;
constexpr std::uint64_t kCopyDelayNs = 2'000'000;

std::vector<std::uint8_t> pattern(std::uint8_t seed) {
  std::vector<std::uint8_t> bytes(kBlockBytes);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::uint8_t>(seed + i * 7 + (i >> 9));
  }
  return bytes;
}

bool equals(const void* memory, const std::vector<std::uint8_t>& expected) {
  return std::memcmp(memory, expected.data(), expected.size()) == 0;
}

// True when `event` completes within a few seconds (not waiting forever
// on a wrong ordering).
bool completes_soon(Device& device, Event event) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (device.query_event(event) != Status::ok) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

class ChunkMoverTest : public ::testing::Test {
 protected:
  ChunkMoverTest() : device_(SimDeviceOptions{.capacity_bytes = 64 * kBlockBytes}) {
    device_.set_copy_delay_ns(kCopyDelayNs);
    EXPECT_EQ(device_.create_stream(&compute_), Status::ok);
    EXPECT_EQ(device_.create_stream(&other_compute_), Status::ok);
  }
  ~ChunkMoverTest() override {
    device_.synchronize();
    for (void* block : blocks_) device_.free(block);
    device_.destroy_stream(compute_);
    device_.destroy_stream(other_compute_);
  }

  void* new_block() {
    void* block = nullptr;
    EXPECT_EQ(device_.malloc(&block, kBlockBytes), Status::ok);
    blocks_.push_back(block);
    return block;
  }

  // Fetches `bytes` into `block`, queues a kernel on compute_ that reads them
  // but is held back by the returned gate, and gives the block back (fenced)
  // while that kernel has yet to run.
  std::unique_ptr<StreamGate> give_back_under_a_held_kernel(
      ChunkMover& mover, KernelQueue& kernels, PayloadMoves& moves, void* block,
      const std::vector<std::uint8_t>& bytes) {
    EXPECT_EQ(mover.fetch(moves, block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
    mover.order_after_fetch(moves, compute_);
    auto gate = std::make_unique<StreamGate>(device_, compute_);
    kernels.check(compute_, block, bytes, "the old payload's kernel");
    mover.record_release(moves, compute_);
    mover.fence_reuse(moves, block, kBlockBytes);
    return gate;
  }

  // A kernel still reading the old payload when the block is given back and
  // handed to `write_new`, which puts a new payload there: the new bytes
  // must land after that kernel, whatever stream writes them.
  void expect_reuse_after_the_previous_payload(
      const std::function<Status(ChunkMover&, PayloadMoves&, void*)>& write_new,
      const std::vector<std::uint8_t>& new_bytes, const std::string& what) {
    ChunkMover mover(device_);
    KernelQueue kernels(device_);
    PayloadMoves old_payload;
    PayloadMoves new_payload;
    void* block = new_block();
    const std::vector<std::uint8_t> old_bytes = pattern(4);  // read by copies in flight
    {
      const auto gate =
          give_back_under_a_held_kernel(mover, kernels, old_payload, block, old_bytes);
      EXPECT_EQ(mover.reuse_fence_count(), 1u);
      ASSERT_EQ(write_new(mover, new_payload, block), Status::ok) << what;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // room for a wrong early write
    }
    mover.wait_for_moves(new_payload);
    device_.synchronize();

    EXPECT_EQ(kernels.mismatches(), 0) << what << " overwrote the block under a kernel";
    EXPECT_TRUE(equals(block, new_bytes)) << what;
    mover.forget(old_payload);
    mover.forget(new_payload);
  }

  SimDevice device_;
  Stream compute_{};
  Stream other_compute_{};
  std::vector<void*> blocks_;
};

TEST_F(ChunkMoverTest, AStreamOrderedAfterTheFetchSeesTheFetchedBytes) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves moves;
  const std::vector<std::uint8_t> host = pattern(1);
  void* block = new_block();

  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, host.data(), host.size()), Status::ok);
  EXPECT_TRUE(moves.fetch_pending);
  mover.order_after_fetch(moves, compute_);
  kernels.check(compute_, block, host, "the fetched block");
  device_.synchronize();

  EXPECT_EQ(kernels.mismatches(), 0) << "the compute stream ran before the fetch finished";
  mover.forget(moves);
}

TEST_F(ChunkMoverTest, AWriteBackReadsTheDeviceCopyAfterTheWorkOfEveryReleasingStream) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> zeros(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, zeros.data(), zeros.size()), Status::ok);
  mover.order_after_fetch(moves, compute_);
  mover.order_after_fetch(moves, other_compute_);

  // Each stream writes one half, held back until the write-back is queued.
  const std::vector<std::uint8_t> expected = pattern(2);
  const std::size_t half = kBlockBytes / 2;
  std::vector<std::uint8_t> host(kBlockBytes, 0xEE);
  {
    StreamGate first(device_, compute_);
    StreamGate second(device_, other_compute_);
    kernels.write(compute_, block, {expected.begin(), expected.begin() + half});
    kernels.write(other_compute_, static_cast<char*>(block) + half,
                  {expected.begin() + half, expected.end()});
    mover.record_release(moves, compute_);
    mover.record_release(moves, other_compute_);
    ASSERT_EQ(mover.write_back(moves, host.data(), block, kBlockBytes), Status::ok);
    EXPECT_TRUE(moves.writeback_pending);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // room for a wrong early copy
  }
  mover.wait_for_moves(moves);

  EXPECT_FALSE(moves.writeback_pending);
  EXPECT_TRUE(equals(host.data(), expected))
      << "the write-back copied the device copy before a released stream's work";
  mover.forget(moves);
}

TEST_F(ChunkMoverTest, AFetchReadsTheHostCopyAfterTheWriteBackThatProducesIt) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves moves;
  void* first_block = new_block();
  void* second_block = new_block();
  const std::vector<std::uint8_t> zeros(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(moves, first_block, kBlockBytes, zeros.data(), zeros.size()), Status::ok);
  mover.order_after_fetch(moves, compute_);

  const std::vector<std::uint8_t> expected = pattern(3);
  std::vector<std::uint8_t> host(kBlockBytes, 0);
  {
    StreamGate gate(device_, compute_);
    kernels.write(compute_, first_block, expected);
    mover.record_release(moves, compute_);
    ASSERT_EQ(mover.write_back(moves, host.data(), first_block, kBlockBytes), Status::ok);
    mover.fence_reuse(moves, first_block, kBlockBytes);
    // Back onto the device, into another block, before the write-back ran.
    ASSERT_EQ(mover.fetch(moves, second_block, kBlockBytes, host.data(), kBlockBytes), Status::ok);
    // Room for wrong early copies: past both copies' delays.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  mover.wait_for_moves(moves);

  EXPECT_TRUE(equals(second_block, expected))
      << "the fetch read the host copy before the write-back wrote it";
  mover.forget(moves);
}

TEST_F(ChunkMoverTest, AFetchIntoAReusedBlockWaitsForTheWorkOfItsPreviousPayload) {
  const std::vector<std::uint8_t> new_bytes = pattern(5);
  expect_reuse_after_the_previous_payload(
      [&](ChunkMover& mover, PayloadMoves& moves, void* block) {
        return mover.fetch(moves, block, kBlockBytes, new_bytes.data(), kBlockBytes);
      },
      new_bytes, "the fetch");
}

TEST_F(ChunkMoverTest, AFetchIntoAnotherBlockDoesNotQueueBehindAFence) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves old_payload;
  PayloadMoves new_payload;
  void* old_block = new_block();
  void* other_block = new_block();
  const std::vector<std::uint8_t> bytes = pattern(6);
  {
    const auto gate = give_back_under_a_held_kernel(mover, kernels, old_payload, old_block, bytes);
    ASSERT_EQ(mover.fetch(new_payload, other_block, kBlockBytes, bytes.data(), kBlockBytes),
              Status::ok);
    // Note [Reuse fences]: the wait is at reuse, not at drop.
    EXPECT_TRUE(completes_soon(device_, new_payload.fetched))
        << "a fetch into a block nobody used waited for another block's kernels";
    EXPECT_EQ(mover.reuse_fence_count(), 1u) << "the fence is still needed for its block";
  }
  device_.synchronize();
  EXPECT_TRUE(equals(other_block, bytes));
  EXPECT_EQ(kernels.mismatches(), 0);
  mover.forget(old_payload);
  mover.forget(new_payload);
}

// Note [Two copy streams]: a zero fill has a stream of its own, so it does
// not wait for the fetches queued before it.
TEST_F(ChunkMoverTest, AZeroFillDoesNotQueueBehindTheFetchesAhead) {
  ChunkMover mover(device_);
  PayloadMoves fetched;
  PayloadMoves filled;
  void* fetch_block = new_block();
  void* fill_block = new_block();
  std::memset(fill_block, 0xab, kBlockBytes);
  const std::vector<std::uint8_t> bytes = pattern(8);
  {
    StreamGate gate(device_, mover.fetch_stream());
    ASSERT_EQ(mover.fetch(fetched, fetch_block, kBlockBytes, bytes.data(), kBlockBytes),
              Status::ok);
    ASSERT_EQ(mover.zero_fill(filled, fill_block, kBlockBytes, kBlockBytes), Status::ok);
    EXPECT_TRUE(completes_soon(device_, filled.fetched))
        << "the zero fill waited for a fetch queued before it";
    EXPECT_EQ(device_.query_event(fetched.fetched), Status::not_ready)
        << "the gate did not hold the fetch";
  }
  mover.wait_for_moves(fetched);
  EXPECT_TRUE(equals(fill_block, std::vector<std::uint8_t>(kBlockBytes, 0)));
  EXPECT_TRUE(equals(fetch_block, bytes));
  mover.forget(fetched);
  mover.forget(filled);
}

// ...but it waits, as a fetch does, for the work on its block's previous payload.
TEST_F(ChunkMoverTest, AZeroFillIntoAReusedBlockWaitsForTheWorkOfItsPreviousPayload) {
  expect_reuse_after_the_previous_payload(
      [](ChunkMover& mover, PayloadMoves& moves, void* block) {
        return mover.zero_fill(moves, block, kBlockBytes, kBlockBytes);
      },
      std::vector<std::uint8_t>(kBlockBytes, 0), "the zero fill");
}

TEST_F(ChunkMoverTest, CompletedFencesArePrunedAndTheirEventsReused) {
  ChunkMover mover(device_);
  const std::vector<std::uint8_t> bytes = pattern(7);
  std::vector<PayloadMoves> payloads(3);
  std::vector<void*> payload_blocks;
  for (PayloadMoves& moves : payloads) {
    payload_blocks.push_back(new_block());
    ASSERT_EQ(mover.fetch(moves, payload_blocks.back(), kBlockBytes, bytes.data(), kBlockBytes),
              Status::ok);
  }
  // Fences are pruned only by a fetch, so all three are held now.
  for (std::size_t i = 0; i < payloads.size(); ++i) {
    mover.fence_reuse(payloads[i], payload_blocks[i], kBlockBytes);
  }
  EXPECT_EQ(mover.reuse_fence_count(), 3u);
  EXPECT_EQ(mover.spare_event_count(), 0u);
  mover.synchronize();

  // The next fetch prunes the fences that have passed; their events are spare.
  PayloadMoves next;
  void* block = new_block();
  ASSERT_EQ(mover.fetch(next, block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
  EXPECT_EQ(mover.reuse_fence_count(), 0u);
  EXPECT_EQ(mover.spare_event_count(), 3u);
  // A new fence takes a spare event rather than creating one.
  mover.fence_reuse(next, block, kBlockBytes);
  EXPECT_EQ(mover.reuse_fence_count(), 1u);
  EXPECT_EQ(mover.spare_event_count(), 2u);

  mover.synchronize();
  for (PayloadMoves& moves : payloads) mover.forget(moves);
  mover.forget(next);
}

TEST_F(ChunkMoverTest, TheHostWaitsForTheFetchAndEveryReleasedStreamBeforeReadingTheDeviceCopy) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> zeros(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, zeros.data(), kBlockBytes), Status::ok);
  mover.order_after_fetch(moves, compute_);
  const std::vector<std::uint8_t> expected = pattern(8);

  std::vector<Event> waits;
  {
    StreamGate gate(device_, compute_);
    kernels.write(compute_, block, expected);
    mover.record_release(moves, compute_);
    waits = mover.waits_before_host_uses_device(moves, /*host_writes=*/false);
    EXPECT_FALSE(waits.empty()) << "the held-back kernel is work the host must wait for";
  }
  for (Event event : waits) ASSERT_EQ(device_.synchronize_event(event), Status::ok);
  mover.note_host_waited(moves, waits);

  EXPECT_FALSE(moves.fetch_pending);
  EXPECT_TRUE(equals(block, expected)) << "the host read before a released kernel wrote";
  mover.forget(moves);
}

// Note [Fenced slabs] in caching_allocator.cc: the allocator may unmap a
// block once the work on the write-back stream up to the fence is done, so
// the fence comes after a fetch still writing the block too.
TEST_F(ChunkMoverTest, AReuseFenceComesAfterAFetchStillWritingTheBlock) {
  ChunkMover mover(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> bytes = pattern(12);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
  mover.fence_reuse(moves, block, kBlockBytes);  // dropped before its fetch is done
  ASSERT_EQ(device_.synchronize_stream(mover.fence_stream()), Status::ok);
  EXPECT_EQ(device_.query_event(moves.fetched), Status::ok)
      << "the fence stream passed the fence while the fetch still ran";
  mover.forget(moves);
}

// Note [Reuse fences]: a fence waits for its own copy's write-back, and not
// for the other copies' write-backs queued on the link before it (a spill
// gives the block back after the fence: Note [Fenced slabs]).
TEST_F(ChunkMoverTest, AReuseFenceWaitsForItsOwnWriteBackAndForNoOtherOnTheLink) {
  ChunkMover mover(device_);
  PayloadMoves dirty;
  PayloadMoves clean;
  void* dirty_block = new_block();
  void* clean_block = new_block();
  const std::vector<std::uint8_t> bytes = pattern(13);
  std::vector<std::uint8_t> host(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(dirty, dirty_block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
  ASSERT_EQ(mover.fetch(clean, clean_block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
  mover.wait_for_moves(dirty);
  mover.wait_for_moves(clean);
  Event after_clean_fence{};
  Event after_dirty_fence{};
  ASSERT_EQ(device_.create_event(&after_clean_fence), Status::ok);
  ASSERT_EQ(device_.create_event(&after_dirty_fence), Status::ok);
  {
    StreamGate gate(device_, mover.writeback_stream());
    ASSERT_EQ(mover.write_back(dirty, host.data(), dirty_block, kBlockBytes), Status::ok);
    mover.fence_reuse(clean, clean_block, kBlockBytes);
    device_.record_event(after_clean_fence, mover.fence_stream());
    EXPECT_TRUE(completes_soon(device_, after_clean_fence))
        << "a clean copy's fence waited for another copy's write-back";
    mover.fence_reuse(dirty, dirty_block, kBlockBytes);
    device_.record_event(after_dirty_fence, mover.fence_stream());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // room for a wrong early fence
    EXPECT_EQ(device_.query_event(after_dirty_fence), Status::not_ready)
        << "a dirty copy's fence passed before its write-back ran";
  }
  ASSERT_EQ(device_.synchronize_event(after_dirty_fence), Status::ok);
  EXPECT_EQ(device_.query_event(dirty.written_back), Status::ok);
  EXPECT_TRUE(equals(host.data(), bytes));
  device_.destroy_event(after_clean_fence);
  device_.destroy_event(after_dirty_fence);
  mover.forget(dirty);
  mover.forget(clean);
}

// Note [Write-backs ahead of spills]: a write-back may run while the device
// copy stays; whoever writes that copy next waits for it, a reader does not.
TEST_F(ChunkMoverTest, AWriterOfTheDeviceCopyWaitsForTheWriteBackReadingIt) {
  ChunkMover mover(device_);
  KernelQueue kernels(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> before = pattern(10);
  std::vector<std::uint8_t> host(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, before.data(), kBlockBytes), Status::ok);
  mover.order_after_fetch(moves, compute_);
  {
    // A reader held back on compute_ keeps the write-back (ordered after it) running.
    StreamGate gate(device_, compute_);
    kernels.check(compute_, block, before, "the reader before the write-back");
    mover.record_release(moves, compute_);
    ASSERT_EQ(mover.write_back(moves, host.data(), block, kBlockBytes), Status::ok);
    EXPECT_FALSE(mover.write_back_done(moves));

    const std::vector<Event> read_waits =
        mover.waits_before_host_uses_device(moves, /*host_writes=*/false);
    const std::vector<Event> write_waits =
        mover.waits_before_host_uses_device(moves, /*host_writes=*/true);
    EXPECT_EQ(std::count(read_waits.begin(), read_waits.end(), moves.written_back), 0);
    EXPECT_EQ(std::count(write_waits.begin(), write_waits.end(), moves.written_back), 1);

    // On a stream: the writer's kernel runs after the write-back read the bytes.
    mover.order_write_after_write_back(moves, other_compute_);
    kernels.write(other_compute_, block, pattern(11));
  }
  device_.synchronize();
  EXPECT_EQ(kernels.mismatches(), 0);
  EXPECT_EQ(host, before) << "the write-back saw the next writer's bytes";
  EXPECT_TRUE(mover.write_back_done(moves));
  mover.forget(moves);
}

TEST_F(ChunkMoverTest, TheHostWaitsForTheWriteBackBeforeTouchingTheHostCopy) {
  ChunkMover mover(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> expected = pattern(9);
  std::vector<std::uint8_t> host(kBlockBytes, 0);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, expected.data(), kBlockBytes), Status::ok);
  ASSERT_EQ(mover.write_back(moves, host.data(), block, kBlockBytes), Status::ok);

  const std::vector<Event> read_waits =
      mover.waits_before_host_touches_host(moves, /*host_writes=*/false);
  const std::vector<Event> write_waits =
      mover.waits_before_host_touches_host(moves, /*host_writes=*/true);
  ASSERT_EQ(read_waits.size(), 1u);
  EXPECT_EQ(read_waits[0], moves.written_back);
  // A host write must not overtake the fetch still reading the host copy.
  EXPECT_EQ(write_waits.size(), moves.fetch_pending ? 2u : 1u);

  for (Event event : read_waits) ASSERT_EQ(device_.synchronize_event(event), Status::ok);
  mover.note_host_waited(moves, read_waits);
  EXPECT_FALSE(moves.writeback_pending);
  EXPECT_TRUE(equals(host.data(), expected));
  mover.forget(moves);
}

TEST_F(ChunkMoverTest, ForgettingAPayloadWaitsForItsMovesAndDestroysItsEvents) {
  ChunkMover mover(device_);
  PayloadMoves moves;
  void* block = new_block();
  const std::vector<std::uint8_t> bytes = pattern(10);
  ASSERT_EQ(mover.fetch(moves, block, kBlockBytes, bytes.data(), kBlockBytes), Status::ok);
  mover.record_release(moves, compute_);
  ASSERT_TRUE(moves.events_created);
  ASSERT_EQ(moves.stream_uses.size(), 1u);

  mover.forget(moves);

  EXPECT_FALSE(moves.events_created);
  EXPECT_FALSE(moves.fetch_pending);
  EXPECT_TRUE(moves.stream_uses.empty());
  EXPECT_TRUE(equals(block, bytes)) << "forget returned before the fetch finished";
}

TEST_F(ChunkMoverTest, AFailedCopyIsAnErrorThatSaysWhy) {
  ChunkMover mover(device_);
  PayloadMoves moves;
  void* block = new_block();
  // More bytes than the block holds: the simulated device refuses the copy.
  const std::vector<std::uint8_t> bytes(2 * kBlockBytes, 1);
  const Status status = mover.fetch(moves, block, kBlockBytes, bytes.data(), bytes.size());
  EXPECT_NE(status, Status::ok);
  EXPECT_NE(ChunkMover::last_error().find("the copy failed"), std::string::npos)
      << ChunkMover::last_error();
  EXPECT_FALSE(moves.fetch_pending);
  mover.forget(moves);
}

}  // namespace
}  // namespace spillway::testing
