// Prefix caching in kv/: the block hash chain, the pool's cache index and LRU eviction list,
// and the KV manager's match_prefix / allocate_slots-with-match / cache_full_blocks.
// check_invariants() runs after every operation.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kv/block_hash.h"
#include "kv/kv_cache_manager.h"

namespace vesper::kv {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockHash, ChainDependsOnParentTokensAndSalt) {
  const BlockHash root = root_block_hash("");
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(chain_block_hash(root, a), chain_block_hash(root, a));
  EXPECT_NE(chain_block_hash(root, a), chain_block_hash(root, b));
  EXPECT_NE(chain_block_hash(root, a), chain_block_hash(root_block_hash("tenant-1"), a));
  EXPECT_NE(root_block_hash("x"), root_block_hash("y"));
  const BlockHash h1 = chain_block_hash(root, a);
  EXPECT_NE(chain_block_hash(h1, b), chain_block_hash(chain_block_hash(root, b), b));
  // Token ids are serialised at a fixed width: {1, 256} and {256, 1} differ, as do negative ids.
  EXPECT_NE(chain_block_hash(root, std::vector<int32_t>{1, 256}), chain_block_hash(root, std::vector<int32_t>{256, 1}));
  EXPECT_NE(chain_block_hash(root, std::vector<int32_t>{-1}), chain_block_hash(root, std::vector<int32_t>{255}));
}

TEST(BlockPoolCache, ReleasedCachedBlocksStayFindableUntilEvicted) {
  BlockPool pool(4, 2);
  const BlockHash root = root_block_hash("");
  const std::vector<int32_t> toks = {7, 8};
  const BlockHash h = chain_block_hash(root, toks);
  auto a = *pool.allocate(1);
  ASSERT_TRUE(pool.register_block(a[0], root, h, toks));
  EXPECT_EQ(pool.lookup(h), a[0]);
  EXPECT_EQ(pool.num_cached(), 1);
  pool.release(a[0]);
  pool.check_invariants();
  EXPECT_EQ(pool.num_free(), 4);  // evictable blocks can be allocated
  EXPECT_EQ(pool.num_evictable(), 1);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.lookup(h), a[0]);
  // Allocation prefers plain free blocks: the cached one survives three allocations...
  auto b = *pool.allocate(3);
  pool.check_invariants();
  EXPECT_EQ(std::count(b.begin(), b.end(), a[0]), 0);
  EXPECT_EQ(pool.lookup(h), a[0]);
  EXPECT_EQ(pool.num_evictions(), 0);
  // ...and is evicted by the fourth.
  auto c = *pool.allocate(1);
  pool.check_invariants();
  EXPECT_EQ(c[0], a[0]);
  EXPECT_FALSE(pool.lookup(h).has_value());
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_EQ(pool.num_cached(), 0);
}

TEST(BlockPoolCache, HitRevivesAnEvictableBlock) {
  BlockPool pool(3, 1);
  const BlockHash root = root_block_hash("");
  const std::vector<int32_t> t = {5};
  const BlockHash h = chain_block_hash(root, t);
  auto a = *pool.allocate(1);
  pool.register_block(a[0], root, h, t);
  pool.release(a[0]);
  pool.add_ref(a[0]);  // a prefix-cache hit
  pool.check_invariants();
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 2);
  // In use, it cannot be evicted: the other two blocks are all there is.
  auto b = *pool.allocate(2);
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_EQ(pool.lookup(h), a[0]);
  pool.check_invariants();
}

TEST(BlockPoolCache, EvictsLeastRecentlyReleasedFirst) {
  BlockPool pool(4, 1);
  const BlockHash root = root_block_hash("");
  std::vector<BlockHash> hashes;
  auto blocks = *pool.allocate(4);
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> t = {i};
    hashes.push_back(chain_block_hash(root, t));
    ASSERT_TRUE(pool.register_block(blocks[i], root, hashes[i], t));
  }
  for (int i : {2, 0, 3, 1}) pool.release(blocks[i]);
  pool.check_invariants();
  // Touch block 0 again (hit, then release): it becomes the most recently used.
  pool.add_ref(blocks[0]);
  pool.release(blocks[0]);
  std::vector<BlockId> order;
  for (int i = 0; i < 4; ++i) order.push_back((*pool.allocate(1))[0]);
  EXPECT_EQ(order, (std::vector<BlockId>{blocks[2], blocks[3], blocks[1], blocks[0]}));
  EXPECT_EQ(pool.num_evictions(), 4);
  pool.check_invariants();
}

TEST(BlockPoolCache, DuplicateContentStaysUncachedAndUnregisterFreesEvictable) {
  BlockPool pool(3, 1);
  const BlockHash root = root_block_hash("");
  const std::vector<int32_t> t = {9};
  const BlockHash h = chain_block_hash(root, t);
  auto a = *pool.allocate(2);
  EXPECT_TRUE(pool.register_block(a[0], root, h, t));
  EXPECT_FALSE(pool.register_block(a[1], root, h, t));  // same content computed twice
  EXPECT_FALSE(pool.register_block(a[0], root, h, t));  // already cached
  EXPECT_EQ(pool.hash_of(a[1]), nullptr);
  pool.release(a[0]);
  pool.release(a[1]);
  EXPECT_EQ(pool.num_evictable(), 1);
  pool.unregister_block(a[0]);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_FALSE(pool.lookup(h).has_value());
  pool.check_invariants();
}

TEST(BlockPoolCache, ClearCacheForgetsEverything) {
  BlockPool pool(2, 1);
  const BlockHash root = root_block_hash("");
  auto a = *pool.allocate(2);
  pool.register_block(a[0], root, chain_block_hash(root, std::vector<int32_t>{1}), std::vector<int32_t>{1});
  pool.register_block(a[1], root, chain_block_hash(root, std::vector<int32_t>{2}), std::vector<int32_t>{2});
  pool.release(a[0]);
  pool.clear_cache();
  pool.check_invariants();
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.num_evictable(), 0);
  EXPECT_EQ(pool.ref_count(a[1]), 1);
}

// A sequence computes `tokens` fully (allocate + cache in one go) and is freed.
void compute_and_free(KvCacheManager& kv, SeqId seq, const std::vector<int32_t>& tokens, const BlockHash& root) {
  const PrefixMatch m = kv.match_prefix(tokens, root);
  ASSERT_TRUE(kv.allocate_slots(seq, m.num_tokens, static_cast<int64_t>(tokens.size()) - m.num_tokens, 0, &m));
  kv.cache_full_blocks(seq, tokens, static_cast<int64_t>(tokens.size()), root);
  kv.check_invariants();
  kv.free(seq);
  kv.check_invariants();
}

TEST(KvPrefixCache, MatchStopsBeforeTheLastTokenAndAtDivergence) {
  KvCacheManager kv(32, 0, 4, true);
  const BlockHash root = root_block_hash("");
  const auto tokens = iota_tokens(18);  // 4 full blocks + 2
  compute_and_free(kv, 1, tokens, root);
  EXPECT_EQ(kv.device_pool().num_cached(), 4);
  EXPECT_EQ(kv.match_prefix(tokens, root).num_tokens, 16);
  // Exactly 16 tokens: the last token must be computed, so only 3 blocks are reused.
  EXPECT_EQ(kv.match_prefix(std::vector<int32_t>(tokens.begin(), tokens.begin() + 16), root).num_tokens, 12);
  // Diverging inside block 2 (token 9): blocks 0 and 1 only.
  auto diverged = tokens;
  diverged[9] = 1;
  const PrefixMatch m = kv.match_prefix(diverged, root);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.blocks.size(), 2u);
  // Another salt sees nothing.
  EXPECT_EQ(kv.match_prefix(tokens, root_block_hash("other")).num_tokens, 0);
  // Prefix caching off: never a match.
  KvCacheManager off(32, 0, 4, false);
  compute_and_free(off, 1, tokens, root);
  EXPECT_EQ(off.match_prefix(tokens, root).num_tokens, 0);
  EXPECT_EQ(off.device_pool().num_cached(), 0);
}

TEST(KvPrefixCache, SharedBlocksAreReferencedOncePerUserAndNeverCopied) {
  KvCacheManager kv(32, 0, 4, true);
  const BlockHash root = root_block_hash("");
  const auto prompt = iota_tokens(10);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10));
  kv.cache_full_blocks(1, prompt, 10, root);
  auto other = prompt;
  other.push_back(3);
  other.push_back(4);
  const PrefixMatch m = kv.match_prefix(other, root);
  ASSERT_EQ(m.num_tokens, 8);
  const auto granted = kv.allocate_slots(2, 8, 4, 0, &m);
  ASSERT_TRUE(granted);
  kv.check_invariants();
  EXPECT_TRUE(granted->copies().empty());
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(1)[0]), 2);
  EXPECT_EQ(kv.block_table(2)[0], kv.block_table(1)[0]);
  EXPECT_EQ(kv.block_table(2)[1], kv.block_table(1)[1]);
  EXPECT_NE(kv.block_table(2)[2], kv.block_table(1)[2]);
  kv.free(1);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().ref_count(kv.block_table(2)[0]), 1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

TEST(KvPrefixCache, AllocationWithAMatchIsAllOrNothing) {
  // 6 blocks of 2: a cached 4-block prefix (evictable) leaves 2 plain free blocks.
  KvCacheManager kv(6, 0, 2, true);
  const BlockHash root = root_block_hash("");
  const auto tokens = iota_tokens(9);
  compute_and_free(kv, 1, tokens, root);
  EXPECT_EQ(kv.device_pool().num_evictable(), 4);
  const PrefixMatch m = kv.match_prefix(tokens, root);
  ASSERT_EQ(m.num_tokens, 8);
  // Hitting 4 evictable blocks and needing 3 new ones: 7 > 6 blocks, refused, nothing changes.
  EXPECT_FALSE(kv.allocate_slots(2, 8, 5, 0, &m));
  kv.check_invariants();
  EXPECT_FALSE(kv.has_device_blocks(2));
  EXPECT_EQ(kv.device_pool().num_evictable(), 4);
  // Needing 2 new ones fits exactly, and the matched blocks are not evicted to make room.
  ASSERT_TRUE(kv.allocate_slots(2, 8, 3, 0, &m));
  kv.check_invariants();
  EXPECT_EQ(std::vector<BlockId>(kv.block_table(2).begin(), kv.block_table(2).begin() + 4), m.blocks);
  EXPECT_EQ(kv.device_pool().num_free(), 0);
}

TEST(KvPrefixCache, LeavesAreEvictedBeforeTheirParents) {
  KvCacheManager kv(8, 0, 1, true);
  const BlockHash root = root_block_hash("");
  compute_and_free(kv, 1, {1, 2, 3, 4, 5}, root);  // caches 5 one-token blocks: a chain
  const std::vector<int32_t> longer = {1, 2, 3, 4, 5, 6};
  const std::vector<BlockId> chain = kv.match_prefix(longer, root).blocks;
  ASSERT_EQ(chain.size(), 5u);
  // The 3 plain free blocks go first; then the chain is eaten from its leaf.
  ASSERT_TRUE(kv.allocate_slots(2, 0, 3));
  EXPECT_EQ(kv.device_pool().num_evictions(), 0);
  for (int64_t n = 1; n <= 5; ++n) {
    ASSERT_TRUE(kv.allocate_slots(2, 2 + n, 1));
    kv.check_invariants();
    EXPECT_EQ(kv.block_table(2).back(), chain[5 - n]);
    EXPECT_EQ(kv.match_prefix(longer, root).num_tokens, 5 - n);
  }
}

TEST(KvPrefixCache, UncacheTakesBackBlocksOfAStepThatWillNotRun) {
  KvCacheManager kv(16, 0, 4, true);
  const BlockHash root = root_block_hash("");
  const auto tokens = iota_tokens(12);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 4));
  kv.cache_full_blocks(1, tokens, 4, root);  // step 1 computed block 0
  ASSERT_TRUE(kv.allocate_slots(1, 4, 8));
  kv.cache_full_blocks(1, tokens, 12, root);  // step 2 planned blocks 1 and 2...
  EXPECT_EQ(kv.device_pool().num_cached(), 3);
  kv.uncache_blocks_from(1, 4);  // ...but was preempted while planning
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_cached(), 1);
  EXPECT_EQ(kv.block_hashes(1).size(), 1u);
  EXPECT_EQ(kv.match_prefix(tokens, root).num_tokens, 4);
}

TEST(KvPrefixCache, ForkSharesHashesAndSwapKeepsThem) {
  KvCacheManager kv(16, 16, 4, true);
  const BlockHash root = root_block_hash("");
  const auto tokens = iota_tokens(10);
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10));
  kv.cache_full_blocks(1, tokens, 10, root);
  kv.fork(1, 2);
  kv.check_invariants();
  EXPECT_EQ(kv.block_hashes(2).size(), 2u);
  ASSERT_TRUE(kv.can_swap_out(2));
  kv.swap_out(2);
  kv.check_invariants();
  EXPECT_EQ(kv.block_hashes(2).size(), 2u);
  kv.swap_in(2);
  kv.check_invariants();
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  EXPECT_TRUE(kv.block_hashes(2).empty());
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

// Thousands of random sequences over a few shared prefixes, with random frees mid-way.
TEST(KvPrefixCache, RandomizedSharingKeepsInvariants) {
  std::mt19937 rng(7);
  KvCacheManager kv(64, 0, 4, true);
  const BlockHash root = root_block_hash("");
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 4; ++p) prefixes.push_back(iota_tokens(8 + 5 * p, 1000 * p));
  struct Live {
    SeqId id;
    std::vector<int32_t> tokens;
    int64_t computed;
  };
  std::vector<Live> live;
  int64_t hits = 0;
  for (SeqId id = 1; id <= 3000; ++id) {
    std::vector<int32_t> t = prefixes[rng() % prefixes.size()];
    t.resize(t.size() - rng() % 6);
    const int extra = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(rng() % 3));
    const PrefixMatch m = kv.match_prefix(t, root);
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(t.size()), m.num_tokens + 1 + rng() % 8);
    if (kv.allocate_slots(id, m.num_tokens, end - m.num_tokens, 0, &m)) {
      hits += m.num_tokens;
      kv.cache_full_blocks(id, t, end, root);
      live.push_back({id, std::move(t), end});
    }
    kv.check_invariants();
    // Grow or free some live sequences.
    for (size_t i = 0; i < live.size();) {
      const unsigned r = rng() % 4;
      if (r == 0 || live[i].computed == static_cast<int64_t>(live[i].tokens.size())) {
        kv.free(live[i].id);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (r == 1 && kv.allocate_slots(live[i].id, live[i].computed, 1)) {
        ++live[i].computed;
        kv.cache_full_blocks(live[i].id, live[i].tokens, live[i].computed, root);
      }
      ++i;
    }
    kv.check_invariants();
    // Every cached block in a live table holds that sequence's tokens at that position.
    for (const Live& l : live) {
      const auto& table = kv.block_table(l.id);
      for (size_t b = 0; b < table.size(); ++b) {
        const auto cached = kv.device_pool().tokens_of(table[b]);
        if (cached.empty()) continue;
        ASSERT_TRUE(std::equal(cached.begin(), cached.end(), l.tokens.begin() + static_cast<int64_t>(b) * 4));
      }
    }
  }
  EXPECT_GT(hits, 1000);
  EXPECT_GT(kv.device_pool().num_evictions(), 0);
  for (const Live& l : live) kv.free(l.id);
  kv.check_invariants();
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

}  // namespace
}  // namespace vesper::kv
