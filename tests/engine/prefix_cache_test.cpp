// Automatic prefix caching through the engine on stories260K: outputs are identical (token ids
// and logits bit for bit) with the cache on and off over prompts built to share prefixes, in
// every scheduling mode; shared prefixes are computed once (counted by the engine); multi-turn
// chats compute only each turn's new tokens; divergence mid-block reuses only the blocks before
// it; salts and skip_reading_prefix_cache isolate requests; eviction under memory pressure keeps
// working; and a long randomized run with aborts keeps every invariant.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>

#include "engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::expect_same;
using testing_util::greedy_params;
using testing_util::make_engine;
using testing_util::run_ids;
using testing_util::run_to_completion;
using testing_util::RunResult;

constexpr int64_t kBlock = 16;  // stories_config's block size

// `n` token ids of story text (BOS first); `variant` picks a different text.
std::vector<int32_t> story_ids(int n, int variant) {
  static auto e = testing_util::make_unsplit_engine(testing_util::stories_config());
  const auto parts = testing_util::varied_prompts(64);
  std::vector<int32_t> ids = {1};
  for (int k = 0; static_cast<int>(ids.size()) < n; ++k) {
    auto more = e->tokenizer().encode(parts[(variant * 13 + k * 5) % parts.size()], false, false);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  ids.resize(n);
  return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// 4 shared prefixes x 16 continuations of assorted lengths, a few prompts that are a prefix
// exactly, some that diverge inside a block, and duplicates.
std::vector<std::vector<int32_t>> sharing_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  const int prefix_len[] = {37, 64, 100, 150};
  const int per_prefix = testing_util::sanitized() ? 8 : 16;  // prompts sharing each prefix
  for (int p = 0; p < 4; ++p) {
    const auto prefix = story_ids(prefix_len[p], p);
    for (int s = 0; s < per_prefix; ++s) {
      if (s == 0) {
        prompts.push_back(prefix);
      } else if (s % 5 == 0) {  // diverges inside a block of the prefix
        auto cut = std::vector<int32_t>(prefix.begin(), prefix.begin() + prefix_len[p] - 7 - s);
        prompts.push_back(concat(cut, story_ids(1 + s, 10 + s)));
      } else {
        prompts.push_back(concat(prefix, story_ids(1 + (s * 7) % 41, 20 + s)));
      }
    }
  }
  prompts.push_back(prompts[3]);
  prompts.push_back(prompts[2 * per_prefix + per_prefix / 2]);
  return prompts;
}

EngineConfig cache_config(bool on) {
  EngineConfig c = testing_util::stories_config();
  c.cache.enable_prefix_caching = on;
  return c;
}

// Cache on (`on`) against off, in every scheduling mode; `small_blocks` KV blocks force
// preemption and eviction, and `swap_gib` of swap space makes swap fall back to recompute.
void check_on_and_off(const EngineConfig& on, int64_t small_blocks, double swap_gib) {
  const auto prompts = sharing_prompts();
  const auto params = greedy_params(24);

  EngineConfig ref_config = on;
  ref_config.cache.enable_prefix_caching = false;
  ref_config.scheduler.max_num_seqs = 1;
  const RunResult ref = run_ids(ref_config, prompts, params);
  EXPECT_EQ(ref.stats.prefix_cache_hits, 0);

  const RunResult together = run_ids(on, prompts, params);
  EXPECT_GT(together.stats.prefix_cache_hits, 0) << "nothing was shared";
  EXPECT_LT(together.stats.prefill_tokens_computed, ref.stats.prefill_tokens_computed);
  expect_same(ref, together, "cache on, all at once");

  EngineConfig alone = on;
  alone.scheduler.max_num_seqs = 1;
  const RunResult one_by_one = run_ids(alone, prompts, params);
  EXPECT_GE(one_by_one.stats.prefix_cache_hits, together.stats.prefix_cache_hits);
  expect_same(ref, one_by_one, "cache on, one at a time");

  EngineConfig chunked = on;
  chunked.scheduler.max_num_batched_tokens = 16;
  const RunResult small_budget = run_ids(chunked, prompts, params);
  EXPECT_GT(small_budget.stats.num_chunked_prefill_steps, 0);
  EXPECT_GT(small_budget.stats.prefix_cache_hits, 0);
  expect_same(ref, small_budget, "cache on, max-num-batched-tokens 16");

  EngineConfig recompute = on;
  recompute.cache.num_gpu_blocks_override = small_blocks;
  recompute.scheduler.preemption_mode = sched::PreemptionMode::kRecompute;
  const RunResult preempted = run_ids(recompute, prompts, params);
  EXPECT_GT(preempted.stats.num_recomputes, 0) << "nothing was preempted";
  EXPECT_GT(preempted.stats.prefix_cache_evictions, 0) << "nothing was evicted";
  EXPECT_GT(preempted.stats.prefix_cache_hits, 0);
  expect_same(ref, preempted, "cache on, preemption by recompute");

  EngineConfig swap = recompute;
  swap.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  swap.scheduler.max_num_batched_tokens = 24;
  swap.cache.swap_space_gib = swap_gib;  // a few blocks: swap falls back to recompute
  const RunResult swapped = run_ids(swap, prompts, params);
  EXPECT_GT(swapped.stats.num_swap_outs, 0) << "nothing was swapped";
  EXPECT_GT(swapped.stats.prefix_cache_hits, 0);
  expect_same(ref, swapped, "cache on, swap with recompute fallback, budget 24");

  // n = 2 parallel samples (forked after the prompt, sharing its blocks) on top of shared prefixes.
  auto two = params;
  two.n = 2;
  EngineConfig off = on;
  off.cache.enable_prefix_caching = false;
  const RunResult ref_two = run_ids(off, prompts, two);
  const RunResult on_two = run_ids(recompute, prompts, two);
  EXPECT_GT(on_two.stats.prefix_cache_hits, 0);
  expect_same(ref_two, on_two, "n = 2, cache on, preemption");
  if (kv_is_kivi(on.cache.kv_dtypes.k) || kv_is_kivi(on.cache.kv_dtypes.v)) {
    for (const RunResult* r : {&together, &one_by_one, &small_budget, &preempted, &swapped}) {
      EXPECT_GT(r->stats.kivi_groups_quantized, 0) << "no KIVI group was stored quantized";
    }
  }
}

TEST(PrefixCache, OnAndOffGiveIdenticalTokensAndLogitsInEveryMode) {
  check_on_and_off(cache_config(true), 40, 0.0002);
}

// KIVI (kivi2, groups of 32, a residual window of 16): a hit is a run of cached residual groups,
// quantized again by the sequence that hits them; outputs equal the cache-off run's bit for bit.
TEST(PrefixCache, KiviOnAndOffGiveIdenticalTokensAndLogitsInEveryMode) {
  EngineConfig on = cache_config(true);
  on.cache.kv_dtypes = {backend::KvDtype::kKivi2, backend::KvDtype::kKivi2};
  on.cache.block_size = 32;
  on.cache.kivi_residual_length = 16;
  backend::KvCacheSpec spec{on.cache.kv_dtypes, 5, 32, 4, 8};
  spec.kivi_residual_length = 16;
  const int64_t per_group = spec.residual_blocks_per_group();
  const double block_gib =
      static_cast<double>(spec.bytes_per_block()) / static_cast<double>(int64_t{1} << 30);
  check_on_and_off(on, 12 * per_group, 2.5 * static_cast<double>(per_group) * block_gib);
}

TEST(PrefixCache, SharedSystemPromptIsComputedOnce) {
  const auto system = story_ids(400, 1);  // 25 blocks exactly
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 32; ++i) {
    std::vector<int32_t> suffix(20);
    for (int k = 0; k < 20; ++k) suffix[k] = 3 + (i * 37 + k * 11) % 500;
    prompts.push_back(concat(system, suffix));
  }
  auto params = greedy_params(4);
  // All 32 arrive together and start in the same step: the first computes the system prompt,
  // the other 31 share its blocks in that very step. (Under pipeline parallelism the sequences
  // are split into one set a stage, planned in turn with plans in flight together (virtual
  // engines): the first of the set planned first computes it, and the other set shares blocks
  // still being computed, which a stage computes before it reads them.)
  const RunResult on = run_ids(cache_config(true), prompts, params);
  EXPECT_EQ(on.stats.prefill_tokens_computed, 400 + 32 * 20);
  EXPECT_EQ(on.stats.prefix_cache_queries, 32 * 420);
  EXPECT_EQ(on.stats.prefix_cache_hits, 31 * 400);
  if (testing_util::test_split().pipeline == 1) {
    EXPECT_EQ(on.outputs.at("0").num_cached_tokens, 0);
  }
  int64_t computed_whole = 0;
  for (int i = 0; i < 32; ++i) {
    const int64_t cached = on.outputs.at(std::to_string(i)).num_cached_tokens;
    EXPECT_TRUE(cached == 0 || cached == 400) << i << ": " << cached;
    computed_whole += cached == 0 ? 1 : 0;
  }
  EXPECT_EQ(computed_whole, 1);
  const RunResult off = run_ids(cache_config(false), prompts, params);
  EXPECT_EQ(off.stats.prefill_tokens_computed, 32 * 420);
  EXPECT_EQ(off.stats.prefix_cache_queries, 0);
  expect_same(off, on, "shared system prompt");

  // Arriving one step apart, they share it just the same.
  auto e = make_engine(cache_config(true));
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(e->add_request({std::to_string(i), prompts[i], params}).ok());
    e->step();
    e->check_invariants();
  }
  run_to_completion(*e);
  EXPECT_EQ(e->stats().prefill_tokens_computed, 400 + 32 * 20);
}

TEST(PrefixCache, MultiTurnChatComputesOnlyEachTurnsNewTokens) {
  auto on = make_engine(cache_config(true));
  // (one process's: a split job follows one engine at a time, and its outputs are one process's)
  auto off = testing_util::make_unsplit_engine(cache_config(false));
  auto params = greedy_params(20);
  std::vector<int32_t> prompt = story_ids(60, 2);
  int64_t cached_before = 0;  // tokens of the previous turn whose KV was computed
  for (int turn = 0; turn < 5; ++turn) {
    const std::string id = "turn" + std::to_string(turn);
    const int64_t computed_before = on->stats().prefill_tokens_computed;
    ASSERT_TRUE(on->add_request({id, prompt, params}).ok());
    ASSERT_TRUE(off->add_request({id, prompt, params}).ok());
    const auto on_out = run_to_completion(*on).at(id);
    const auto off_out = run_to_completion(*off).at(id);
    ASSERT_EQ(on_out.outputs[0].token_ids, off_out.outputs[0].token_ids) << "turn " << turn;
    for (size_t t = 0; t < on_out.outputs[0].logprobs.size(); ++t)
      ASSERT_EQ(on_out.outputs[0].logprobs[t].logprob, off_out.outputs[0].logprobs[t].logprob);
    const int64_t n = static_cast<int64_t>(prompt.size());
    const int64_t expected_hit = std::min(cached_before / kBlock, (n - 1) / kBlock) * kBlock;
    EXPECT_EQ(on_out.num_cached_tokens, expected_hit) << "turn " << turn;
    EXPECT_EQ(on->stats().prefill_tokens_computed - computed_before, n - expected_hit)
        << "turn " << turn;
    if (turn > 0) {
      EXPECT_LT(n - expected_hit, 12 + 20 + kBlock) << "more than the new part was computed";
    }
    // Next turn: this prompt, the answer, and a new user message.
    const auto& answer = on_out.outputs[0].token_ids;
    cached_before =
        n + static_cast<int64_t>(answer.size()) - 1;  // the last token is never computed
    prompt = concat(concat(prompt, answer), story_ids(12, 30 + turn));
    ASSERT_LE(static_cast<int64_t>(prompt.size()) + 20, 512);
  }
  EXPECT_GT(on->stats().prefix_cache_hits, 0);
  testing_util::expect_no_leaks(*on);
}

TEST(PrefixCache, DivergenceMidBlockReusesOnlyTheBlocksBeforeIt) {
  auto e = make_engine(cache_config(true));
  const auto a = story_ids(100, 3);
  auto params = greedy_params(2);
  ASSERT_TRUE(e->add_request({"a", a, params}).ok());
  run_to_completion(*e);
  // Same first 53 tokens, then different: block 3 (tokens 48..63) differs.
  auto b = std::vector<int32_t>(a.begin(), a.begin() + 53);
  for (int k = 0; k < 47; ++k) b.push_back(3 + (k * 13 + 5) % 500);
  ASSERT_NE(b[53], a[53]);
  const int64_t before = e->stats().prefill_tokens_computed;
  ASSERT_TRUE(e->add_request({"b", b, params}).ok());
  const auto out = run_to_completion(*e).at("b");
  EXPECT_EQ(out.num_cached_tokens, 48);
  EXPECT_EQ(e->stats().prefill_tokens_computed - before, 100 - 48);
}

TEST(PrefixCache, SaltsIsolateRequestsAndSkipReadingComputesEverything) {
  auto e = make_engine(cache_config(true));
  const auto prompt = story_ids(70, 4);  // 4 full blocks reusable (64 tokens)
  auto run = [&](const std::string& id, const std::string& salt, bool skip) {
    auto p = greedy_params(2);
    p.cache_salt = salt;
    p.skip_reading_prefix_cache = skip;
    EXPECT_TRUE(e->add_request({id, prompt, p}).ok());
    return run_to_completion(*e).at(id).num_cached_tokens;
  };
  EXPECT_EQ(run("plain", "", false), 0);
  EXPECT_EQ(run("plain again", "", false), 64);
  EXPECT_EQ(run("tenant a", "a", false), 0);
  EXPECT_EQ(run("tenant b", "b", false), 0);
  EXPECT_EQ(run("tenant a again", "a", false), 64);
  EXPECT_EQ(run("skip", "", true), 0);
  EXPECT_EQ(run("after skip", "", false), 64);
}

TEST(PrefixCache, EvictionUnderMemoryPressureKeepsOutputsIdentical) {
  // 24 blocks (384 tokens) for prompts over 5 prefixes of ~100 tokens, in runs of 4 per
  // prefix: the cache cannot hold the working set and must evict, least recently used first,
  // never a block in use.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 40; ++i) {
    const int p = (i / 4) % 5;
    prompts.push_back(concat(story_ids(90 + 3 * p, p), story_ids(5 + i % 9, 40 + i)));
  }
  EngineConfig on = cache_config(true);
  on.cache.num_gpu_blocks_override = 24;
  on.scheduler.max_num_seqs = 2;
  EngineConfig off = on;
  off.cache.enable_prefix_caching = false;
  const auto params = greedy_params(16);
  const RunResult a = run_ids(off, prompts, params);
  const RunResult b = run_ids(on, prompts, params);
  EXPECT_GT(b.stats.prefix_cache_evictions, 0);
  EXPECT_GT(b.stats.prefix_cache_hits, 0);
  EXPECT_LE(b.stats.kv_blocks_cached, 24);
  expect_same(a, b, "24 blocks");
}

TEST(PrefixCacheLongRun, RandomRequestsOverFewPrefixesWithAborts) {
  const uint64_t seed = ::testing::UnitTest::GetInstance()->random_seed() + 777;
  std::printf("  seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 5; ++p) prefixes.push_back(story_ids(20 + 17 * p, 50 + p));
  for (auto mode : {sched::PreemptionMode::kRecompute, sched::PreemptionMode::kSwap}) {
    EngineConfig c = cache_config(true);
    c.cache.num_gpu_blocks_override = 40;
    c.cache.block_size = 8;
    c.cache.swap_space_gib = 0.001;
    c.scheduler.max_num_batched_tokens = 64;
    c.scheduler.max_num_seqs = 16;
    c.scheduler.max_model_len = 256;
    c.scheduler.preemption_mode = mode;
    auto e = make_engine(c);
    // Per mode: 2,000 in all; 600 under the sanitizers (the asan test preset sets
    // VESPER_SANITIZED), whose run checks memory, not volume.
    const int total = testing_util::sanitized() ? 300 : 1000;
    int added = 0, finished = 0, aborted = 0;
    std::set<std::string> live;
    // Greedy requests with the same prompt must agree on every token both produced.
    std::map<std::vector<int32_t>, std::vector<int32_t>> greedy_by_prompt;
    std::map<std::string, std::vector<int32_t>> prompt_of;
    for (int64_t step = 0; (added < total || e->has_unfinished()) && step < 200000; ++step) {
      for (int k = 0; k < 2 && added < total; ++k) {
        std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
        prompt.resize(prompt.size() - rng() % 10);
        const int extra = static_cast<int>(rng() % 12);
        for (int i = 0; i < extra; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 4));
        sample::SamplingParams p = greedy_params(1 + static_cast<int64_t>(rng() % 12));
        p.logprobs = -1;
        p.n = (rng() % 8 == 0) ? 2 : 1;
        const std::string id = std::to_string(added++);
        ASSERT_TRUE(e->add_request({id, prompt, p}).ok());
        live.insert(id);
        prompt_of[id] = prompt;
      }
      if (!live.empty() && rng() % 6 == 0) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_TRUE(e->abort(*it));
        live.erase(it);
        ++aborted;
      }
      for (auto& out : e->step()) {
        if (!out.finished) continue;
        ++finished;
        live.erase(out.request_id);
        const auto& ids = out.outputs[0].token_ids;
        auto [it, fresh] = greedy_by_prompt.emplace(prompt_of.at(out.request_id), ids);
        const size_t common = std::min(it->second.size(), ids.size());
        ASSERT_TRUE(std::equal(ids.begin(), ids.begin() + common, it->second.begin()))
            << "request " << out.request_id
            << " disagrees with an earlier request with the same prompt";
        if (ids.size() > it->second.size()) it->second = ids;
        for (const auto& o : out.outputs) ASSERT_EQ(o.token_ids, ids);
      }
      e->check_invariants();
    }
    EXPECT_EQ(finished + aborted, total);
    const auto s = e->stats();
    EXPECT_GT(s.num_preemptions, 0);
    EXPECT_GT(s.prefix_cache_hits, 0);
    EXPECT_GT(s.prefix_cache_evictions, 0);
    testing_util::expect_no_leaks(*e);
  }
}

}  // namespace
}  // namespace vesper::engine
