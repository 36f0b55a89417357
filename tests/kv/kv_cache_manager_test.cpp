// kv/KvCacheManager: block tables grown by allocate_slots (all or nothing), fork with
// copy-on-write of the partial last block, free, and swapping to and from the host pool.
// check_invariants() runs after every operation.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace vesper::kv {
namespace {

// Covers num_tokens tokens of which [first_written, num_tokens) are written now.
bool alloc(KvCacheManager& kv, SeqId seq, int64_t first_written, int64_t num_tokens,
           std::vector<BlockCopy>* copies_out = nullptr) {
  const auto granted = kv.allocate_slots(seq, first_written, num_tokens - first_written);
  kv.check_invariants();
  const std::vector<BlockCopy> copies = granted ? granted->copies() : std::vector<BlockCopy>{};
  if (copies_out != nullptr)
    *copies_out = copies;
  else
    EXPECT_TRUE(copies.empty());
  return granted.has_value();
}

TEST(KvCacheManager, BlocksForRoundsUp) {
  KvCacheManager kv(4, 0, 16);
  EXPECT_EQ(kv.blocks_for(0), 0);
  EXPECT_EQ(kv.blocks_for(1), 1);
  EXPECT_EQ(kv.blocks_for(16), 1);
  EXPECT_EQ(kv.blocks_for(17), 2);
  EXPECT_EQ(kv.block_size(), 16);
}

TEST(KvCacheManager, AllocateSlotsGrowsTheTableAcrossBlockBoundaries) {
  KvCacheManager kv(10, 0, 4);
  EXPECT_FALSE(kv.has_device_blocks(1));
  EXPECT_TRUE(kv.block_table(1).empty());
  ASSERT_TRUE(alloc(kv, 1, 0, 1));
  EXPECT_EQ(kv.block_table(1).size(), 1u);
  ASSERT_TRUE(alloc(kv, 1, 1, 4));  // fills the first block exactly
  EXPECT_EQ(kv.block_table(1).size(), 1u);
  ASSERT_TRUE(alloc(kv, 1, 4, 5));  // first token of the second block
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  ASSERT_TRUE(alloc(kv, 1, 5, 12));  // a chunk ending on a boundary
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  ASSERT_TRUE(alloc(kv, 1, 12, 21));  // a chunk spanning two more blocks
  EXPECT_EQ(kv.block_table(1).size(), 6u);
  EXPECT_EQ(kv.device_pool().num_free(), 4);
  // Blocks come from the free list in order and stay in place as the table grows.
  EXPECT_EQ(kv.block_table(1), (std::vector<BlockId>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(kv.has_device_blocks(1));
  EXPECT_FALSE(kv.is_swapped(1));
  // Covering fewer tokens than the table already holds changes nothing.
  ASSERT_TRUE(alloc(kv, 1, 3, 4));
  EXPECT_EQ(kv.block_table(1).size(), 6u);
}

TEST(KvCacheManager, FailedAllocationOfANewSequenceLeavesNothingBehind) {
  KvCacheManager kv(3, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 8));
  EXPECT_FALSE(alloc(kv, 2, 0, 5));  // needs 2 blocks, 1 free
  EXPECT_FALSE(kv.has_device_blocks(2));
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.device_pool().num_free(), 1);
  EXPECT_EQ(kv.block_table(1), (std::vector<BlockId>{0, 1}));
  ASSERT_TRUE(alloc(kv, 2, 0, 4));
  EXPECT_EQ(kv.block_table(2), (std::vector<BlockId>{2}));
}

TEST(KvCacheManager, FailedGrowthOfARunningSequenceChangesNothing) {
  KvCacheManager kv(4, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 6));
  ASSERT_TRUE(alloc(kv, 2, 0, 4));
  const auto before = kv.block_table(1);
  EXPECT_FALSE(alloc(kv, 1, 6, 13));  // needs 2 more blocks, 1 free
  EXPECT_EQ(kv.block_table(1), before);
  EXPECT_EQ(kv.device_pool().num_free(), 1);
  ASSERT_TRUE(alloc(kv, 1, 6, 12));
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_EQ(kv.device_pool().num_free(), 0);
}

TEST(KvCacheManager, ForkSharesEveryBlock) {
  KvCacheManager kv(8, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 10));
  kv.fork(1, 2);
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(2), kv.block_table(1));
  for (BlockId b : kv.block_table(1)) EXPECT_EQ(kv.device_pool().ref_count(b), 2);
  EXPECT_EQ(kv.device_pool().num_free(), 5);
  kv.fork(2, 3);
  kv.check_invariants();
  for (BlockId b : kv.block_table(1)) EXPECT_EQ(kv.device_pool().ref_count(b), 3);
  EXPECT_EQ(kv.device_pool().num_free(), 5);
}

TEST(KvCacheManager, CopyOnWriteOfThePartialLastBlockKeepsFullBlocksShared) {
  KvCacheManager kv(8, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 10));  // blocks 0,1 full, block 2 holds tokens 8,9
  kv.fork(1, 2);
  const std::vector<BlockId> shared = kv.block_table(1);
  // The parent decodes token 10: it writes into the shared partial block, so it gets a copy.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(alloc(kv, 1, 10, 11, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared[2]);
  EXPECT_NE(copies[0].dst, shared[2]);
  const auto& parent = kv.block_table(1);
  ASSERT_EQ(parent.size(), 3u);
  EXPECT_EQ(parent[0], shared[0]);
  EXPECT_EQ(parent[1], shared[1]);
  EXPECT_EQ(parent[2], copies[0].dst);
  EXPECT_EQ(kv.block_table(2), shared);  // the child keeps the original
  EXPECT_EQ(kv.device_pool().ref_count(shared[0]), 2);
  EXPECT_EQ(kv.device_pool().ref_count(shared[1]), 2);
  EXPECT_EQ(kv.device_pool().ref_count(shared[2]), 1);
  EXPECT_EQ(kv.device_pool().ref_count(copies[0].dst), 1);
  // The child is now the only owner of the original last block: no copy for its write.
  ASSERT_TRUE(alloc(kv, 2, 10, 11, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.block_table(2), shared);
  // Further decodes into private blocks never copy.
  ASSERT_TRUE(alloc(kv, 1, 11, 12, &copies));
  EXPECT_TRUE(copies.empty());
}

TEST(KvCacheManager, ForkAtABlockBoundaryNeedsNoCopy) {
  KvCacheManager kv(8, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 8));
  kv.fork(1, 2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(alloc(kv, 1, 8, 9, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.block_table(1).size(), 3u);
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(1)[0]), 2);
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(1)[1]), 2);
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(1)[2]), 1);
}

TEST(KvCacheManager, CopyOnWriteIsReportedByTheAllocation) {
  KvCacheManager kv(8, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 6));
  kv.fork(1, 2);
  const auto granted = kv.allocate_slots(1, 6, 1);
  ASSERT_TRUE(granted);
  const std::vector<BlockCopy>& copies = granted->copies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, kv.block_table(2)[1]);
  EXPECT_EQ(copies[0].dst, kv.block_table(1)[1]);
}

TEST(KvCacheManager, ChunkWrittenAcrossSharedBlocksCopiesEachOfThem) {
  // A forked child that rewrites several shared blocks (as a recompute would) copies each.
  KvCacheManager kv(8, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 10));
  kv.fork(1, 2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(alloc(kv, 2, 2, 11, &copies));  // writes tokens 2..10: blocks 0, 1, 2
  EXPECT_EQ(copies.size(), 3u);
  std::set<BlockId> parent(kv.block_table(1).begin(), kv.block_table(1).end());
  for (BlockId b : kv.block_table(2)) EXPECT_EQ(parent.count(b), 0u);
  EXPECT_EQ(kv.device_pool().num_free(), 2);
}

TEST(KvCacheManager, FailedCopyOnWriteChangesNothing) {
  KvCacheManager kv(4, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 6));  // 2 blocks
  kv.fork(1, 2);
  ASSERT_TRUE(alloc(kv, 3, 0, 8));  // the last 2 blocks
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(alloc(kv, 1, 6, 7, &copies));  // needs a copy of block 1, nothing free
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(kv.block_table(1), kv.block_table(2));
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(1)[1]), 2);
  // With two blocks free, the copy and a new block for token 8 both fit.
  kv.free(3);
  kv.check_invariants();
  ASSERT_TRUE(alloc(kv, 1, 6, 9, &copies));  // copy of block 1 and a new block for token 8
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_EQ(kv.block_table(1).size(), 3u);
}

TEST(KvCacheManager, FreeReleasesEverythingIncludingSharedBlocks) {
  KvCacheManager kv(8, 4, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 10));
  kv.fork(1, 2);
  kv.free(1);
  kv.check_invariants();
  EXPECT_FALSE(kv.has_device_blocks(1));
  EXPECT_EQ(kv.device_pool().num_free(), 5);
  for (BlockId b : kv.block_table(2)) EXPECT_EQ(kv.device_pool().ref_count(b), 1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_free(), 8);
  kv.free(42);  // unknown: no-op
  kv.free(2);   // already freed: no-op
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_free(), 8);
}

TEST(KvCacheManager, FreedTableReleasesLastBlocksFirst) {
  KvCacheManager kv(4, 0, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 12));  // blocks 0, 1, 2
  kv.free(1);
  // Released 2, 1, 0, each to the front of the free list: 0, 1, 2, then 3 (never used).
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate_slots(2, 0, 16));
  EXPECT_EQ(kv.block_table(2), (std::vector<BlockId>{0, 1, 2, 3}));
}

TEST(KvCacheManager, SwapOutAndInRoundTrip) {
  KvCacheManager kv(6, 5, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 2));
  ASSERT_TRUE(alloc(kv, 2, 0, 11));  // 3 blocks
  const std::vector<BlockId> device_before = kv.block_table(2);
  ASSERT_TRUE(kv.can_swap_out(2));
  const auto out = kv.swap_out(2);
  kv.check_invariants();
  ASSERT_EQ(out.size(), 3u);
  std::set<BlockId> host_blocks;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].device, device_before[i]);
    host_blocks.insert(out[i].host);
    EXPECT_EQ(kv.host_pool().ref_count(out[i].host), 1);
    EXPECT_EQ(kv.device_pool().ref_count(out[i].device), 0);
  }
  EXPECT_EQ(host_blocks.size(), 3u);
  EXPECT_TRUE(kv.is_swapped(2));
  EXPECT_FALSE(kv.has_device_blocks(2));
  EXPECT_TRUE(kv.block_table(2).empty());
  EXPECT_EQ(kv.device_pool().num_free(), 5);
  EXPECT_EQ(kv.host_pool().num_free(), 2);
  EXPECT_FALSE(kv.can_swap_out(2));  // nothing left on the device

  // Someone else takes blocks meanwhile; swap-in gets fresh ones.
  ASSERT_TRUE(alloc(kv, 3, 0, 4));
  ASSERT_TRUE(kv.can_swap_in(2));
  const auto in = kv.swap_in(2);
  kv.check_invariants();
  ASSERT_EQ(in.size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(in[i].host, out[i].host);  // block i comes back from where it went
    EXPECT_EQ(kv.block_table(2)[i], in[i].device);
    EXPECT_EQ(kv.device_pool().ref_count(in[i].device), 1);
  }
  EXPECT_FALSE(kv.is_swapped(2));
  EXPECT_TRUE(kv.has_device_blocks(2));
  EXPECT_EQ(kv.host_pool().num_free(), 5);
  EXPECT_EQ(kv.device_pool().num_free(), 1);
  EXPECT_FALSE(kv.can_swap_in(2));
  // The swapped-in sequence grows as before.
  ASSERT_TRUE(alloc(kv, 2, 11, 13));
  EXPECT_EQ(kv.block_table(2).size(), 4u);
}

TEST(KvCacheManager, SwapOutOfAForkedSequenceLeavesTheSiblingItsBlocks) {
  KvCacheManager kv(6, 6, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 6));
  kv.fork(1, 2);
  const auto shared = kv.block_table(1);
  const auto out = kv.swap_out(1);
  kv.check_invariants();
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(kv.block_table(2), shared);
  for (BlockId b : shared) EXPECT_EQ(kv.device_pool().ref_count(b), 1);
  EXPECT_EQ(kv.device_pool().num_free(), 4);
  EXPECT_EQ(kv.host_pool().num_free(), 4);
  // Both siblings on the host hold their own copies there.
  kv.swap_out(2);
  kv.check_invariants();
  EXPECT_EQ(kv.host_pool().num_free(), 2);
  EXPECT_EQ(kv.device_pool().num_free(), 6);
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.host_pool().num_free(), 6);
}

TEST(KvCacheManager, CanSwapRespectsPoolLimits) {
  KvCacheManager kv(4, 2, 4);
  EXPECT_FALSE(kv.can_swap_out(1));  // unknown
  EXPECT_FALSE(kv.can_swap_in(1));
  ASSERT_TRUE(alloc(kv, 1, 0, 12));  // 3 blocks: more than the host holds
  EXPECT_FALSE(kv.can_swap_out(1));
  EXPECT_FALSE(kv.can_swap_in(1));  // not swapped
  ASSERT_TRUE(alloc(kv, 2, 0, 4));
  ASSERT_TRUE(kv.can_swap_out(2));
  kv.swap_out(2);
  kv.check_invariants();
  ASSERT_TRUE(alloc(kv, 3, 0, 4));  // device full again
  EXPECT_FALSE(kv.can_swap_in(2));
  kv.free(3);
  EXPECT_TRUE(kv.can_swap_in(2));
  // A host pool of zero blocks never takes a sequence.
  KvCacheManager no_host(4, 0, 4);
  ASSERT_TRUE(alloc(no_host, 1, 0, 1));
  EXPECT_FALSE(no_host.can_swap_out(1));
}

TEST(KvCacheManager, CanSwapInAsksForRoomForTheNextTokensToo) {
  KvCacheManager kv(4, 4, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 8));  // 2 full blocks
  kv.swap_out(1);
  ASSERT_TRUE(alloc(kv, 2, 0, 8));  // 2 of the 4 device blocks
  EXPECT_TRUE(kv.can_swap_in(1));
  EXPECT_TRUE(kv.can_swap_in(1, 8));   // what it has
  EXPECT_FALSE(kv.can_swap_in(1, 9));  // its next token needs a third block
  kv.free(2);
  EXPECT_TRUE(kv.can_swap_in(1, 9));
  EXPECT_TRUE(kv.can_swap_in(1, 16));
  EXPECT_FALSE(kv.can_swap_in(1, 17));
  EXPECT_FALSE(kv.can_swap_in(2, 1));  // not swapped
  kv.swap_in(1);
  ASSERT_TRUE(alloc(kv, 1, 8, 16));
}

TEST(KvCacheManager, FreeOfASwappedSequenceReleasesHostBlocks) {
  KvCacheManager kv(4, 4, 4);
  ASSERT_TRUE(alloc(kv, 1, 0, 9));
  kv.swap_out(1);
  EXPECT_EQ(kv.host_pool().num_free(), 1);
  kv.free(1);
  kv.check_invariants();
  EXPECT_FALSE(kv.is_swapped(1));
  EXPECT_EQ(kv.host_pool().num_free(), 4);
  EXPECT_EQ(kv.device_pool().num_free(), 4);
}

using KvCacheManagerDeathTest = ::testing::Test;

TEST_F(KvCacheManagerDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvCacheManager kv(4, 1, 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.allocate_slots(1, 0, 8));
  EXPECT_DEATH(kv.swap_out(1), "swap_out of sequence 1 without room");
  EXPECT_DEATH(kv.swap_in(1), "swap_in of sequence 1 without room");
  EXPECT_DEATH(kv.fork(7, 8), "fork of sequence 7 without blocks");
  EXPECT_DEATH(kv.fork(1, 1), "fork into existing sequence 1");
  ASSERT_TRUE(kv.allocate_slots(2, 0, 1));
  kv.swap_out(2);
  EXPECT_DEATH(kv.allocate_slots(2, 1, 1), "allocate_slots for swapped-out sequence 2");
}

}  // namespace
}  // namespace vesper::kv

namespace vesper::kv {
namespace {

// KIVI tables: groups of 6 tokens whose residual rows take 3 blocks each (2 rows a block); a
// residual window of 3.
TEST(KvCacheManager, KiviTablesQuantizeGroupsOutOfTheResidualWindow) {
  KvCacheManager kv(40, 40, 6);
  kv.enable_kivi(2, 3);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 15).has_value());  // 3 groups as residual rows
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(1).size(), 9u);
  EXPECT_EQ(kv.blocks_for(15), 9);
  EXPECT_EQ(kv.entries_for(1, 15), 9);
  const std::vector<BlockId> before = kv.block_table(1);
  // A residual row's slot: its group's blocks, 2 rows each.
  EXPECT_EQ(kv.slot(1, 0), int64_t{before[0]} * 2);
  EXPECT_EQ(kv.slot(1, 5), int64_t{before[2]} * 2 + 1);
  EXPECT_EQ(kv.slot(1, 14), int64_t{before[7]} * 2);
  // A query at position 15 reads tokens before 15 + 1 - 3 = 13 quantized: groups 0 and 1.
  const std::vector<GroupQuantization> q = kv.compact(1, 15);
  kv.check_invariants();
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].rows, std::vector<BlockId>(before.begin(), before.begin() + 3));
  EXPECT_EQ(q[1].rows, std::vector<BlockId>(before.begin() + 3, before.begin() + 6));
  EXPECT_EQ(kv.quantized_groups(1), 2);
  const std::vector<BlockId>& table = kv.block_table(1);
  ASSERT_EQ(table.size(), 5u);  // two quantized blocks, then group 2's three
  EXPECT_EQ(table[0], q[0].dst);
  EXPECT_EQ(table[1], q[1].dst);
  EXPECT_EQ(std::vector<BlockId>(table.begin() + 2, table.end()),
            std::vector<BlockId>(before.begin() + 6, before.end()));
  // Group 2's rows keep their slots after the groups before it are quantized.
  EXPECT_EQ(kv.slot(1, 14), int64_t{before[7]} * 2);
  for (const GroupQuantization& g : q)
    for (BlockId r : g.rows) EXPECT_NE(r, g.dst) << "a group's rows are not its destination";
  EXPECT_EQ(kv.device_pool().num_used(), 5);
  EXPECT_TRUE(kv.compact(1, 15).empty()) << "nothing more to quantize at the same position";
  // Growing past group 2 adds whole residual groups after the quantized ones.
  ASSERT_TRUE(kv.allocate_slots(1, 15, 4).has_value());
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(1).size(), 2u + 2 * 3);
  EXPECT_EQ(kv.entries_for(1, 19), 8);
  // Rollback keeps whole groups; a fork shares everything, quantized groups included.
  kv.truncate(1, 16);
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(1).size(), 5u);
  kv.fork(1, 2);
  kv.check_invariants();
  EXPECT_EQ(kv.quantized_groups(2), 2);
  // Swapped out and in, the table keeps its form.
  ASSERT_TRUE(kv.can_swap_out(2));
  kv.swap_out(2);
  kv.check_invariants();
  EXPECT_EQ(kv.quantized_groups(2), 2);
  ASSERT_TRUE(kv.can_swap_in(2, 16));
  kv.swap_in(2);
  kv.check_invariants();
  EXPECT_EQ(kv.block_table(2).size(), 5u);
  // A residual window of 0: a query at position 5 reads its own group quantized, but the group is
  // quantized only once its last row (written by that query's step) is in.
  KvCacheManager none(10, 0, 6);
  none.enable_kivi(2, 0);
  ASSERT_TRUE(none.allocate_slots(3, 0, 6).has_value());
  EXPECT_TRUE(none.compact(3, 5).empty());
  EXPECT_EQ(none.compact(3, 6).size(), 1u);
  // Nor past the rows a companion (a draft model's cache) has written.
  ASSERT_TRUE(none.allocate_slots(4, 0, 12).has_value());
  EXPECT_TRUE(none.compact(4, 12, 5).empty());
  EXPECT_EQ(none.compact(4, 12, 7).size(), 1u);
  // With no free block, compaction waits (attention quantizes the group itself meanwhile).
  KvCacheManager full(3, 0, 6);
  full.enable_kivi(2, 0);
  ASSERT_TRUE(full.allocate_slots(7, 0, 6).has_value());
  EXPECT_TRUE(full.compact(7, 6).empty());
  EXPECT_EQ(full.quantized_groups(7), 0);
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

// KIVI with the prefix cache: a full group's residual blocks are cached; compaction releases them
// to the evictable list, still findable; a new sequence's hit is the run of residual groups (all
// of a group's blocks or none), shared, and its own compaction quantizes them into fresh blocks.
TEST(KvCacheManager, KiviPrefixHitsAreRunsOfCachedResidualGroups) {
  KvCacheManager kv(40, 40, 6, /*enable_prefix_caching=*/true);
  kv.enable_kivi(2, 3);
  const BlockHash root = root_block_hash("");
  // 2 full groups and 4 tokens of a third.
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  ASSERT_TRUE(kv.allocate_slots(1, 0, 16).has_value());
  kv.cache_full_blocks(1, tokens, 16, root);
  kv.check_invariants();
  kv.check_sequence(1, tokens, 16);
  const std::vector<BlockId> rows = kv.block_table(1);
  // Group 0 leaves the residual window: its three blocks are released, but stay cached.
  ASSERT_EQ(kv.compact(1, 12).size(), 1u);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_used(), 1 + 6);
  // Another sequence with the same first 15 tokens hits both full groups: six residual blocks, in
  // order (group 0's evictable ones revived).
  const std::vector<int32_t> other = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 99, 98};
  const PrefixMatch m = kv.match_prefix(other, root);
  EXPECT_EQ(m.num_tokens, 12);
  EXPECT_EQ(m.hashes.size(), 2u);
  EXPECT_EQ(m.blocks, std::vector<BlockId>(rows.begin(), rows.begin() + 6));
  ASSERT_TRUE(kv.allocate_slots(2, 12, 5, 0, &m).has_value());
  kv.check_invariants();
  kv.check_sequence(2, other, 12);
  EXPECT_EQ(kv.quantized_groups(2), 0);
  EXPECT_EQ(kv.block_table(2).size(), 9u);
  // Its compaction quantizes the hit groups into its own blocks and lets the shared ones go.
  const std::vector<GroupQuantization> q = kv.compact(2, 16);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].rows, std::vector<BlockId>(rows.begin(), rows.begin() + 3));
  kv.check_invariants();
  EXPECT_EQ(kv.quantized_groups(2), 2);
  // With group 1's blocks uncached (sequence 1's tokens from 6 on taken back), only group 0 is
  // found.
  kv.uncache_blocks_from(1, 6);
  kv.check_invariants();
  EXPECT_EQ(kv.match_prefix(other, root).num_tokens, 6);
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
}

// Sinks + window: before the prompt's end nothing is freed; after it, the blocks wholly between
// the sinks and the window of the next query are, their entries left as kNoBlock. Holes survive
// forks, swap-out and swap-in (only live blocks move), and freeing leaks nothing.
TEST(KvCacheManager, WindowFreesTheBlocksBetweenSinksAndWindow) {
  KvCacheManager kv(32, 16, 4);
  backend::KvSparsity w{.sink_tokens = 4, .window = 8, .dense_from = 20};
  std::vector<BlockOp> ops;
  ASSERT_TRUE(kv.allocate_slots(1, 0, 40).has_value());
  EXPECT_FALSE(kv.prepare_step(1, 10, INT64_MAX, w, ops)) << "inside the prompt: dense";
  EXPECT_EQ(kv.num_live_blocks(1), 10);
  // The query at 40 skips [4, 33): blocks 1..7 (positions 4..31).
  EXPECT_TRUE(kv.prepare_step(1, 40, INT64_MAX, w, ops));
  EXPECT_TRUE(ops.empty());
  const std::vector<BlockId>& t = kv.block_table(1);
  ASSERT_EQ(t.size(), 10u);
  for (size_t e = 0; e < t.size(); ++e) EXPECT_EQ(t[e] == kNoBlock, e >= 1 && e < 8) << e;
  EXPECT_EQ(kv.num_live_blocks(1), 3);
  EXPECT_EQ(kv.num_free_device_blocks(), 29);
  EXPECT_FALSE(kv.prepare_step(1, 40, INT64_MAX, w, ops)) << "nothing more at the same position";
  kv.check_invariants();

  kv.fork(1, 2);
  ASSERT_TRUE(kv.allocate_slots(1, 40, 1).has_value());
  ASSERT_TRUE(kv.can_swap_out(1));
  const std::vector<SwapMapping> out = kv.swap_out(1);
  EXPECT_EQ(out.size(), 4u) << "only live blocks move";
  EXPECT_EQ(kv.host_pool().num_free(), 12);
  kv.check_invariants();
  ASSERT_TRUE(kv.can_swap_in(1, 41));
  const std::vector<SwapMapping> in = kv.swap_in(1);
  EXPECT_EQ(in.size(), 4u);
  const std::vector<BlockId>& back = kv.block_table(1);
  ASSERT_EQ(back.size(), 11u);
  for (size_t e = 0; e < back.size(); ++e) EXPECT_EQ(back[e] == kNoBlock, e >= 1 && e < 8) << e;
  kv.check_invariants();
  kv.truncate(1, 20);  // back into the holes: the freed entries are dropped, nothing released twice
  kv.check_invariants();
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.num_free_device_blocks(), 32);
  EXPECT_EQ(kv.host_pool().num_free(), 16);
}

}  // namespace
}  // namespace vesper::kv
