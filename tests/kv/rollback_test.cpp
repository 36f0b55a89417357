// The KV manager's speculative contract under a long random workload: 2,000 sequences that
// allocate with lookahead slots, write speculative tokens, keep a random number of them and roll
// the rest back (truncate), with prefix caching, forks and frees. After every operation the
// invariants hold and no block caches a token that was not committed; at the end nothing leaked.
// The seed is printed; VESPER_KV_SEED replays one.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdlib>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace vesper::kv {
namespace {

struct Live {
  SeqId id;
  std::vector<int32_t> committed;  // tokens whose K/V are computed and kept
  int64_t target;                  // length it grows to
};

TEST(KvRollback, RandomSpeculationLeaksNoBlockAndCachesNoUncommittedToken) {
  const uint64_t seed = std::getenv("VESPER_KV_SEED")
                            ? std::strtoull(std::getenv("VESPER_KV_SEED"), nullptr, 10)
                            : std::random_device{}();
  std::printf("KvRollback: VESPER_KV_SEED=%" PRIu64 "\n", seed);
  SCOPED_TRACE("VESPER_KV_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };

  for (const int64_t block_size : {1, 4, 16}) {
    KvCacheManager kv(512 / block_size + 8, 0, block_size, /*enable_prefix_caching=*/true);
    const BlockHash root = root_block_hash("");
    // A few shared prompt prefixes, so that cached blocks are matched and shared.
    std::vector<std::vector<int32_t>> prefixes(3);
    for (auto& p : prefixes)
      for (int i = 0; i < 40; ++i) p.push_back(static_cast<int32_t>(uniform(0, 5)));
    std::vector<Live> live;
    SeqId next = 1;
    int64_t started = 0, speculated = 0, rolled_back = 0, matched = 0;
    while (started < 2000 / 3 + 1 || !live.empty()) {
      if (started < 2000 / 3 + 1 && live.size() < 12) {
        std::vector<int32_t> prompt = prefixes[uniform(0, 2)];
        prompt.resize(static_cast<size_t>(uniform(1, 40)));
        const SeqId id = next++;
        const PrefixMatch m = kv.match_prefix(prompt, root);
        if (kv.allocate_slots(id, m.num_tokens, static_cast<int64_t>(prompt.size()) - m.num_tokens,
                              0, &m)) {
          matched += m.num_tokens;
          kv.cache_full_blocks(id, prompt, static_cast<int64_t>(prompt.size()), root);
          live.push_back({id, prompt, static_cast<int64_t>(prompt.size()) + uniform(1, 40)});
          ++started;
        }
        kv.check_invariants();
      }
      for (size_t i = 0; i < live.size();) {
        Live& l = live[i];
        const auto n = static_cast<int64_t>(l.committed.size());
        if (n >= l.target || uniform(0, 30) == 0) {
          kv.free(l.id);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
          kv.check_invariants();
          continue;
        }
        // One step: the next token plus k speculative ones, and lookahead slots past them.
        const int64_t k = uniform(0, 5), lookahead = uniform(0, 3);
        if (kv.allocate_slots(l.id, n, 1 + k, lookahead)) {
          EXPECT_GE(static_cast<int64_t>(kv.block_table(l.id).size()),
                    kv.blocks_for(n + 1 + k + lookahead));
          // Verification keeps the next token and a random number of the speculative ones.
          const int64_t accepted = uniform(0, k);
          for (int64_t t = 0; t < 1 + accepted; ++t)
            l.committed.push_back(static_cast<int32_t>(uniform(0, 5)));
          speculated += k;
          rolled_back += k - accepted;
          kv.truncate(l.id, static_cast<int64_t>(l.committed.size()));
          EXPECT_EQ(static_cast<int64_t>(kv.block_table(l.id).size()),
                    kv.blocks_for(static_cast<int64_t>(l.committed.size())));
          kv.cache_full_blocks(l.id, l.committed, static_cast<int64_t>(l.committed.size()), root);
        }
        kv.check_invariants();
        kv.check_sequence(l.id, l.committed, static_cast<int64_t>(l.committed.size()));
        ++i;
      }
    }
    EXPECT_EQ(kv.device_pool().num_used(), 0) << "block size " << block_size << ": blocks leaked";
    EXPECT_GT(rolled_back, 0);
    EXPECT_GT(speculated, rolled_back);
    EXPECT_GT(matched, 0);
    kv.check_invariants();
  }
}

TEST(KvRollback, TruncateUncachesBlocksPastTheKeptTokensAndReleasesThem) {
  KvCacheManager kv(16, 0, 4, true);
  const BlockHash root = root_block_hash("");
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_TRUE(kv.allocate_slots(1, 0, 10, /*num_lookahead=*/6));
  EXPECT_EQ(kv.block_table(1).size(), 4u);  // 16 slots
  kv.cache_full_blocks(1, tokens, 10, root);
  EXPECT_EQ(kv.block_hashes(1).size(), 2u);
  const BlockId second = kv.block_table(1)[1];
  kv.truncate(1, 5);  // keeps tokens 0..4: blocks 0 and 1
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  EXPECT_EQ(kv.block_hashes(1).size(), 1u);
  EXPECT_EQ(kv.device_pool().hash_of(second), nullptr);  // its tokens past 5 are not committed
  EXPECT_EQ(kv.device_pool().num_used(), 2);
  kv.check_invariants();
  kv.truncate(1, 0);
  EXPECT_TRUE(kv.block_table(1).empty());
  kv.free(1);
  EXPECT_EQ(kv.device_pool().num_used(), 0);
  kv.check_invariants();
}

}  // namespace
}  // namespace vesper::kv
