// kv/BlockPool: reference counts, free-list order (most recently freed reused first),
// all-or-nothing allocation, and the checks that catch misuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "kv/block_pool.h"

namespace vesper::kv {
namespace {

TEST(BlockPool, StartsWithEveryBlockFree) {
  BlockPool pool(5);
  EXPECT_EQ(pool.num_blocks(), 5);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.num_used(), 0);
  for (BlockId b = 0; b < 5; ++b) EXPECT_EQ(pool.ref_count(b), 0);
  pool.check_invariants();
}

TEST(BlockPool, AllocateGivesBlocksWithRefCountOneInFreeListOrder) {
  BlockPool pool(6);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*a, (std::vector<BlockId>{0, 1}));
  auto b = pool.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<BlockId>{2, 3, 4}));
  for (BlockId id : {0, 1, 2, 3, 4}) EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.ref_count(5), 0);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_used(), 5);
  pool.check_invariants();
}

TEST(BlockPool, AllocateZeroBlocksSucceedsWithNothing) {
  BlockPool pool(2);
  auto a = pool.allocate(0);
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->empty());
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_invariants();
}

TEST(BlockPool, FailedAllocationLeavesStateUnchanged) {
  BlockPool pool(4);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.has_value());
  pool.release((*a)[1]);  // free list: 1, 3
  EXPECT_FALSE(pool.allocate(3).has_value());
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.ref_count(1), 0);
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.ref_count(3), 0);
  pool.check_invariants();
  // The free list's order is untouched too: the next allocation sees 1 then 3.
  auto b = pool.allocate(2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<BlockId>{1, 3}));
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_EQ(pool.num_free(), 0);
  pool.check_invariants();
}

TEST(BlockPool, MostRecentlyFreedBlockIsReusedFirst) {
  BlockPool pool(5);
  auto all = pool.allocate(5);
  ASSERT_TRUE(all.has_value());
  for (BlockId id : {3, 0, 4}) pool.release(id);
  pool.check_invariants();
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ((*a)[0], 4);
  pool.release(1);  // free list now: 1, 0, 3
  auto b = pool.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, (std::vector<BlockId>{1, 0, 3}));
  pool.check_invariants();
}

TEST(BlockPool, SharedBlockReturnsToFreeListOnlyAfterLastRelease) {
  BlockPool pool(3);
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.has_value());
  const BlockId id = (*a)[0];
  pool.add_ref(id);
  pool.add_ref(id);
  EXPECT_EQ(pool.ref_count(id), 3);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(id);
  pool.release(id);
  EXPECT_EQ(pool.ref_count(id), 1);
  EXPECT_EQ(pool.num_free(), 2);
  pool.check_invariants();
  pool.release(id);
  EXPECT_EQ(pool.ref_count(id), 0);
  EXPECT_EQ(pool.num_free(), 3);
  pool.check_invariants();
  // It went to the front of the free list, before the two never-used blocks.
  auto b = pool.allocate(3);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->front(), id);
}

TEST(BlockPool, RandomOperationsKeepInvariantsAndMatchAModel) {
  const unsigned seed = std::random_device{}();
  std::printf("BlockPool random seed: %u\n", seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t n = 17;
  BlockPool pool(n);
  std::vector<int32_t> refs(n, 0);
  std::vector<BlockId> free_order;  // model of the free list
  for (BlockId b = 0; b < n; ++b) free_order.push_back(b);
  for (int op = 0; op < 20000; ++op) {
    const int kind = static_cast<int>(rng() % 3);
    std::vector<BlockId> used;
    for (BlockId b = 0; b < n; ++b)
      if (refs[b] > 0) used.push_back(b);
    if (kind == 0) {
      const int64_t want = static_cast<int64_t>(rng() % 6);
      auto got = pool.allocate(want);
      if (want > static_cast<int64_t>(free_order.size())) {
        ASSERT_FALSE(got.has_value());
      } else {
        ASSERT_TRUE(got.has_value());
        std::vector<BlockId> expect(free_order.begin(), free_order.begin() + want);
        ASSERT_EQ(*got, expect);
        free_order.erase(free_order.begin(), free_order.begin() + want);
        for (BlockId b : expect) refs[b] = 1;
      }
    } else if (kind == 1 && !used.empty()) {
      const BlockId b = used[rng() % used.size()];
      pool.add_ref(b);
      ++refs[b];
    } else if (!used.empty()) {
      const BlockId b = used[rng() % used.size()];
      pool.release(b);
      if (--refs[b] == 0) free_order.insert(free_order.begin(), b);
    }
    pool.check_invariants();
    ASSERT_EQ(pool.num_free(), static_cast<int64_t>(free_order.size()));
    for (BlockId b = 0; b < n; ++b) ASSERT_EQ(pool.ref_count(b), refs[b]) << "block " << b;
  }
}

using BlockPoolDeathTest = ::testing::Test;

TEST_F(BlockPoolDeathTest, ReleaseOfAFreeBlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2);
  EXPECT_DEATH(pool.release(1), "release of block 1");
}

TEST_F(BlockPoolDeathTest, AddRefOfAFreeBlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2);
  EXPECT_DEATH(pool.add_ref(0), "add_ref on block 0");
}

TEST_F(BlockPoolDeathTest, OutOfRangeBlockAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2);
  EXPECT_DEATH(pool.release(2), "release of block 2");
  EXPECT_DEATH(pool.add_ref(-1), "add_ref on block -1");
}

}  // namespace
}  // namespace vesper::kv
