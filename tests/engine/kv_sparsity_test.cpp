// KV sparsity through the engine on stories260K, for sinks + window (StreamingLLM,
// --kv-sink-tokens / --kv-window) and Quest (--kv-sparsity quest --kv-sparse-budget): the outputs
// do not depend on batching, chunking or preemption (by recompute and by swap); sequences within
// the window or budget give exactly the dense result; the sparsity does change longer outputs; a
// request that opts out ("kv_sparsity": "none") is dense; and, with a window, an output longer
// than the whole KV cache completes, its blocks freed as it decodes.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::expect_same;
using testing_util::RunResult;

EngineConfig window_config(int64_t sinks, int64_t window) {
  EngineConfig c = testing_util::stories_config();
  c.cache.kv_sink_tokens = sinks;
  c.cache.kv_window = window;
  return c;
}

EngineConfig quest_config(int64_t budget) {
  EngineConfig c = testing_util::stories_config();
  c.cache.kv_sparse_budget = budget;
  return c;
}

// The bytes of one of stories260K's KV blocks (5 layers, 4 KV heads of 8) under `c`, in GiB.
double block_gib(const EngineConfig& c) {
  backend::KvCacheSpec spec{c.cache.kv_dtypes, 5, c.cache.block_size, 4, 8};
  spec.kivi_residual_length = c.cache.kivi_residual_length;
  spec.key_bounds = c.cache.kv_sparse_budget > 0;
  return static_cast<double>(spec.bytes_per_block()) / static_cast<double>(int64_t{1} << 30);
}

// Greedy, 48 tokens: the same tokens and logprob bits alone, all at once, with a 16-token budget,
// and with `small_blocks` blocks (preempted by recompute, by swap, and swap falling back to
// recompute).
void check_invariance(const EngineConfig& base, int64_t small_blocks = 20) {
  const int n = testing_util::sanitized() ? 16 : 48;
  const auto prompts = testing_util::varied_prompts(n);
  EngineConfig one = base;
  one.scheduler.max_num_seqs = 1;
  one.cache.enable_prefix_caching = false;
  const RunResult alone = testing_util::run_texts(one, prompts);

  const RunResult together = testing_util::run_texts(base, prompts);
  EXPECT_LT(together.stats.num_steps, alone.stats.num_steps / 4) << "requests were not batched";
  if (kv_is_kivi(base.cache.kv_dtypes.k)) {
    EXPECT_GT(together.stats.kivi_groups_quantized, 0) << "no KIVI group was stored quantized";
  }
  expect_same(alone, together, "all at once");

  EngineConfig chunked = base;
  chunked.scheduler.max_num_batched_tokens = 16;
  const RunResult small_budget = testing_util::run_texts(chunked, prompts);
  EXPECT_GT(small_budget.stats.num_chunked_prefill_steps, 0);
  expect_same(alone, small_budget, "max-num-batched-tokens 16");

  EngineConfig recompute = base;
  recompute.cache.num_gpu_blocks_override = small_blocks;
  const RunResult preempted = testing_util::run_texts(recompute, prompts);
  EXPECT_GT(preempted.stats.num_recomputes, 0) << "nothing was preempted";
  expect_same(alone, preempted, "preemption by recompute");

  EngineConfig swap = recompute;
  swap.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  swap.cache.swap_space_gib = 500 * block_gib(base);
  const RunResult swapped = testing_util::run_texts(swap, prompts);
  EXPECT_GT(swapped.stats.num_swap_outs, 0) << "nothing was swapped";
  expect_same(alone, swapped, "preemption by swap");

  EngineConfig both = swap;
  both.scheduler.max_num_batched_tokens = 24;
  both.cache.swap_space_gib = 4.5 * block_gib(base);
  const RunResult mixed = testing_util::run_texts(both, prompts);
  EXPECT_GT(mixed.stats.num_swap_outs + mixed.stats.num_recomputes, 0);
  expect_same(alone, mixed, "small budget, swap with recompute fallback");
}

TEST(KvWindow, SameTokensAndLogitsHoweverScheduled) {
  check_invariance(window_config(4, 16));
}

// A 48-token budget (three blocks: the first, one chosen, the query's own).
TEST(KvQuest, SameTokensAndLogitsHoweverScheduled) {
  check_invariance(quest_config(48));
}

// Over a KIVI cache (groups of 32, a residual window of 16, so that groups are stored quantized
// while sequences run) with a 96-token budget (the first group, one chosen, the query's own): a
// group's bounds are those of its rows as written, so the choice, and the output, do not depend on
// when the engine stored which group quantized.
TEST(KvQuest, KiviSameTokensAndLogitsHoweverScheduled) {
  EngineConfig c = quest_config(96);
  c.cache.kv_dtypes = {backend::KvDtype::kKivi2, backend::KvDtype::kKivi2};
  c.cache.block_size = 32;
  c.cache.kivi_residual_length = 16;
  backend::KvCacheSpec spec{c.cache.kv_dtypes, 5, 32, 4, 8};
  spec.kivi_residual_length = 16;
  // Room for about two sequences of ~150 tokens held as residual rows.
  check_invariance(c, 10 * spec.residual_blocks_per_group());
  // Applied: past the budget some outputs leave KIVI's dense ones.
  const auto prompts = testing_util::varied_prompts(12);
  EngineConfig dense = c;
  dense.cache.kv_sparse_budget = 0;
  const RunResult full = testing_util::run_texts(dense, prompts);
  const RunResult sparse = testing_util::run_texts(
      [&] {
        EngineConfig narrow = c;
        narrow.cache.kv_sparse_budget = 64;
        return narrow;
      }(),
      prompts);
  int differ = 0;
  for (const auto& [id, out] : full.outputs)
    if (out.outputs[0].token_ids != sparse.outputs.at(id).outputs[0].token_ids) ++differ;
  EXPECT_GT(differ, 0) << "a 64-token budget gave every output KIVI's dense result";
}

// Within its budget a sequence is dense bit for bit; past it, Quest changes long outputs; a
// request that opts out is dense.
TEST(KvQuest, DenseWithinTheBudgetAppliedPastItAndOptOut) {
  const auto prompts = testing_util::varied_prompts(12);
  const RunResult dense = testing_util::run_texts(testing_util::stories_config(), prompts);
  expect_same(dense, testing_util::run_texts(quest_config(256), prompts),
              "a budget over every sequence");
  const RunResult narrow = testing_util::run_texts(quest_config(32), prompts);
  int differ = 0;
  for (const auto& [id, out] : dense.outputs)
    if (out.outputs[0].token_ids != narrow.outputs.at(id).outputs[0].token_ids) ++differ;
  EXPECT_GT(differ, 0) << "a 32-token budget gave every output the dense result";
  sample::SamplingParams opt_out = testing_util::greedy_params();
  opt_out.kv_dense = true;
  expect_same(dense, testing_util::run_texts(quest_config(32), prompts, opt_out),
              "requests that opted out");
}

// A window that still reaches the sinks for every query changes nothing: bit for bit the dense
// run. A short one changes long outputs (it is applied), and a request that opts out of it gets
// the dense result.
TEST(KvWindow, DenseBelowTheWindowAppliedAboveItAndOptOut) {
  const auto prompts = testing_util::varied_prompts(12);
  const RunResult dense = testing_util::run_texts(testing_util::stories_config(), prompts);
  // Prompts here are under 100 tokens, outputs 48: every position within 4 + 252.
  const RunResult wide = testing_util::run_texts(window_config(4, 252), prompts);
  expect_same(dense, wide, "a window wider than every sequence");

  const RunResult narrow = testing_util::run_texts(window_config(4, 16), prompts);
  int differ = 0;
  for (const auto& [id, out] : dense.outputs)
    if (out.outputs[0].token_ids != narrow.outputs.at(id).outputs[0].token_ids) ++differ;
  EXPECT_GT(differ, 0) << "a 4 + 16 window gave every output the dense result";

  sample::SamplingParams opt_out = testing_util::greedy_params();
  opt_out.kv_dense = true;
  const RunResult dense_again = testing_util::run_texts(window_config(4, 16), prompts, opt_out);
  expect_same(dense, dense_again, "requests that opted out");
}

// One request of 460 tokens against a cache of 12 blocks (192 tokens): dense, it is refused as
// too large for the cache; with a window it runs to the end, its footprint bounded.
TEST(KvWindow, AnOutputLongerThanTheCacheCompletes) {
  EngineConfig c = window_config(4, 32);
  c.cache.num_gpu_blocks_override = 12;
  c.scheduler.max_num_batched_tokens = 64;
  auto e = testing_util::make_engine(c);
  ASSERT_NE(e, nullptr);
  const std::vector<int32_t> prompt = e->tokenizer().encode("Once upon a time", true, false);
  ASSERT_TRUE(e->add_request({"long", prompt, testing_util::greedy(460)}).ok());
  sample::SamplingParams dense = testing_util::greedy(460);
  dense.kv_dense = true;
  const Status refused = e->add_request({"dense", prompt, dense});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("KV cache holds"), std::string::npos)
      << refused.error().message;
  int64_t most_blocks = 0;
  std::map<std::string, RequestOutput> done;
  while (e->has_unfinished()) {
    for (auto& out : e->step())
      if (out.finished) done[out.request_id] = std::move(out);
    e->check_invariants();
    most_blocks = std::max(most_blocks, e->stats().kv_blocks_used);
  }
  ASSERT_EQ(done.count("long"), 1u);
  EXPECT_EQ(done["long"].outputs[0].token_ids.size(), 460u);
  // Sinks (1 block), the window (2-3 blocks) and the block being written.
  EXPECT_LE(most_blocks, 5);
  testing_util::expect_no_leaks(*e);
}

}  // namespace
}  // namespace vesper::engine
