// The allocator's internal structures on their own: BlockAddressMap against
// std::unordered_map, and BlockPool's best fit per stream.
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <unordered_map>

#include "allocator/caching/block.h"
#include "allocator/caching/block_address_map.h"
#include "allocator/caching/block_pool.h"

namespace spillway::testing {
namespace {

TEST(BlockAddressMap, AgreesWithUnorderedMapOverRandomInsertsAndTakes) {
  BlockAddressMap map;
  std::unordered_map<std::uintptr_t, Block*> reference;
  std::deque<Block> blocks;
  std::mt19937_64 rng(42);
  for (int step = 0; step < 200000; ++step) {
    // Addresses in a narrow, 512-aligned range so probe runs collide and wrap.
    const std::uintptr_t address = 0x10000 + (rng() % 8192) * 512;
    if (rng() % 2 == 0) {
      if (reference.count(address) != 0) continue;
      Block& block = blocks.emplace_back();
      block.address = address;
      map.insert(&block);
      reference[address] = &block;
    } else {
      Block* taken = map.take(address);
      auto found = reference.find(address);
      if (found == reference.end()) {
        ASSERT_EQ(taken, nullptr);
      } else {
        ASSERT_EQ(taken, found->second);
        reference.erase(found);
      }
    }
    ASSERT_EQ(map.size(), reference.size());
    if (step % 5000 == 0) {
      for (const auto& [addr, block] : reference) ASSERT_EQ(map.find(addr), block);
      std::size_t visited = 0;
      map.for_each([&](Block* block) {
        ++visited;
        EXPECT_EQ(reference.at(block->address), block);
      });
      ASSERT_EQ(visited, reference.size());
    }
  }
  EXPECT_EQ(map.find(0), nullptr);
  EXPECT_EQ(map.take(0x12345600), nullptr);
}

Block make_block(std::uintptr_t address, std::size_t size, void* stream) {
  Block block;
  block.address = address;
  block.size = size;
  block.stream = Stream{stream};
  return block;
}

TEST(BlockPool, BestFitIsPerStreamSmallestThenLowestAddress) {
  BlockPool pool(BlockPool::Kind::small);
  // Streams ordered null < s1 < s2, each with a block larger than its
  // neighbours' requests below, so a fit that ignored the stream would show.
  void* s1 = reinterpret_cast<void*>(0x1000);
  void* s2 = reinterpret_cast<void*>(0x2000);
  Block blocks[] = {make_block(0x1000, 4096, s1),    make_block(0x9000, 8192, s1),
                    make_block(0x5000, 8192, s1),    make_block(0x20000, 1024, s2),
                    make_block(0x40000, 131072, s2), make_block(0x30000, 512, nullptr)};
  for (Block& block : blocks) pool.insert(&block);
  EXPECT_EQ(pool.block_count(), 6u);
  EXPECT_EQ(pool.largest_block_bytes(), 131072u);
  auto take = [&](Stream stream, std::size_t size) {
    Block* block = pool.best_fit(stream, size);
    if (block != nullptr) pool.remove(block);
    return block;
  };
  EXPECT_EQ(take(Stream{}, 1024), nullptr);       // s1's blocks are not the default stream's
  EXPECT_EQ(take(Stream{s1}, 16384), nullptr);    // nor are s2's s1's
  EXPECT_EQ(take(Stream{s1}, 5000), &blocks[2]);  // 8 KiB, lower address
  EXPECT_EQ(take(Stream{s1}, 5000), &blocks[1]);
  EXPECT_EQ(take(Stream{s1}, 5000), nullptr);
  EXPECT_EQ(take(Stream{s2}, 2048), &blocks[4]);
  EXPECT_EQ(take(Stream{s2}, 1024), &blocks[3]);
  EXPECT_EQ(take(Stream{}, 1), &blocks[5]);
  pool.insert(&blocks[2]);
  pool.remove(&blocks[0]);
  EXPECT_EQ(take(Stream{s1}, 1), &blocks[2]);
  EXPECT_EQ(pool.block_count(), 0u);
}

TEST(BlockPool, UpdateRangeKeepsTheOrderWhetherInPlaceOrNot) {
  BlockPool pool(BlockPool::Kind::large);
  Block a = make_block(0x100000, 4 << 20, nullptr);
  Block b = make_block(0x900000, 8 << 20, nullptr);
  Block c = make_block(0x2000000, 16 << 20, nullptr);
  for (Block* block : {&a, &b, &c}) pool.insert(block);
  pool.update_range(&b, 0x980000, (8 << 20) - 0x80000);  // still between a and c: in place
  EXPECT_EQ(pool.best_fit(Stream{}, 5 << 20), &b);
  EXPECT_EQ(b.address, 0x980000u);
  pool.update_range(&b, 0x980000, 1 << 20);  // now the smallest: moved
  EXPECT_EQ(pool.best_fit(Stream{}, 1), &b);
  EXPECT_EQ(pool.best_fit(Stream{}, (1 << 20) + 1), &a);
  pool.update_range(&b, 0x900000, 32 << 20);  // now the largest: moved
  EXPECT_EQ(pool.best_fit(Stream{}, (16 << 20) + 1), &b);
  EXPECT_EQ(pool.best_fit(Stream{}, 5 << 20), &c);
  EXPECT_EQ(pool.block_count(), 3u);
  EXPECT_EQ(pool.largest_block_bytes(), 32u << 20);
}

TEST(BlockPool, SplitRulesFollowPyTorch) {
  BlockPool small(BlockPool::Kind::small);
  BlockPool large(BlockPool::Kind::large);
  Block block = make_block(0x1000, 2 << 20, nullptr);
  EXPECT_TRUE(small.should_split(block, (2 << 20) - 512));
  EXPECT_FALSE(small.should_split(block, 2 << 20));
  EXPECT_FALSE(large.should_split(block, 1 << 20));         // rest exactly 1 MiB
  EXPECT_TRUE(large.should_split(block, (1 << 20) - 512));  // rest above 1 MiB
}

TEST(BlockPool, WholeSegmentsAreFreeBlocksWithoutNeighbours) {
  BlockPool pool(BlockPool::Kind::large);
  Block whole = make_block(0x100000, 8 << 20, nullptr);
  Block left = make_block(0x2000000, 4 << 20, nullptr);
  Block right = make_block(0x2400000, 4 << 20, nullptr);
  left.next = &right;
  right.prev = &left;
  right.state = BlockState::allocated;
  pool.insert(&whole);
  pool.insert(&left);
  const std::vector<Block*> segments = pool.whole_segments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0], &whole);
  EXPECT_EQ(pool.free_bytes(), 12u << 20);
}

}  // namespace
}  // namespace spillway::testing
