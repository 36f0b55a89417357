// Batch invariance through the engine: 64 prompts of varied lengths on stories260K, greedy, 48
// tokens each, give identical token ids and bit-identical logprobs (so identical logits) when run
// one at a time, all at once, with a tiny token budget (chunked prefill), and with a KV cache so
// small that sequences are preempted by recompute and by swap; for every KV cache type (each type
// against itself: a type changes the numbers, never their dependence on scheduling). Each run
// asserts that the feature it exercises actually happened.
#include <gtest/gtest.h>

#include <cstring>

#include "engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::make_engine;
using testing_util::run_to_completion;

using testing_util::expect_same;
using testing_util::RunResult;

RunResult run_all(const EngineConfig& config, const std::vector<std::string>& prompts) {
  return testing_util::run_texts(config, prompts);
}

class BatchInvariance : public ::testing::TestWithParam<backend::KvDtype> {};

// Runs the prompts alone, all at once, with a 16-token budget, and with `small_blocks` KV blocks
// (preemption by recompute, by swap, and swap falling back to recompute): identical results.
void check_invariance(const EngineConfig& base, int64_t small_blocks, double block_gib,
                      double mixed_swap_blocks = 5.5) {
  // Swap space is sized in bytes, and a tensor-parallel rank holds 1/T of each block's KV heads
  // (test_split.h): as many blocks for the same bytes as one process has.
  block_gib /= static_cast<double>(testing_util::test_split().tensor);
  // Under a sanitizer 24 prompts: still enough to batch, chunk, preempt and swap.
  const auto prompts = testing_util::varied_prompts(testing_util::sanitized() ? 24 : 64);
  EngineConfig one = base;
  one.scheduler.max_num_seqs = 1;
  one.cache.enable_prefix_caching = false;  // the reference: nothing shared, nothing batched
  const RunResult alone = run_all(one, prompts);
  EXPECT_EQ(alone.stats.num_preemptions, 0);

  const RunResult together = run_all(base, prompts);
  EXPECT_LT(together.stats.num_steps, alone.stats.num_steps / 10) << "requests were not batched";
  expect_same(alone, together, "all at once");

  EngineConfig chunked = base;
  chunked.scheduler.max_num_batched_tokens = 16;
  const RunResult small_budget = run_all(chunked, prompts);
  EXPECT_GT(small_budget.stats.num_chunked_prefill_steps, 0) << "no prompt was split";
  EXPECT_LE(small_budget.stats.max_batched_tokens_seen, 16);
  expect_same(alone, small_budget, "max-num-batched-tokens 16");

  EngineConfig recompute = base;
  recompute.cache.num_gpu_blocks_override = small_blocks;
  recompute.scheduler.preemption_mode = sched::PreemptionMode::kRecompute;
  const RunResult preempted = run_all(recompute, prompts);
  EXPECT_GT(preempted.stats.num_recomputes, 0) << "nothing was preempted";
  expect_same(alone, preempted, "preemption by recompute");

  EngineConfig swap = recompute;
  swap.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  swap.cache.swap_space_gib = 500 * block_gib;
  const RunResult swapped = run_all(swap, prompts);
  EXPECT_GT(swapped.stats.num_swap_outs, 0) << "nothing was swapped";
  expect_same(alone, swapped, "preemption by swap");

  EngineConfig both = recompute;
  both.scheduler.max_num_batched_tokens = 24;
  both.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  // A few blocks: swap falls back to recompute.
  both.cache.swap_space_gib = mixed_swap_blocks * block_gib;
  const RunResult mixed = run_all(both, prompts);
  EXPECT_GT(mixed.stats.num_swap_outs, 0);
  EXPECT_GT(mixed.stats.num_recomputes, 0);
  expect_same(alone, mixed, "small budget, swap with recompute fallback");
  if (kv_is_kivi(base.cache.kv_dtypes.k) || kv_is_kivi(base.cache.kv_dtypes.v)) {
    for (const RunResult* r : {&alone, &together, &small_budget, &preempted, &swapped, &mixed}) {
      EXPECT_GT(r->stats.kivi_groups_quantized, 0) << "no KIVI group was stored quantized";
    }
  }
}

TEST_P(BatchInvariance, SameTokensAndLogitsHoweverScheduled) {
  const backend::KvDtypes dtypes{GetParam(), GetParam()};
  EngineConfig base = testing_util::stories_config();
  base.cache.kv_dtypes = dtypes;
  // stories260K's KV block: 5 layers, 4 KV heads of 8, 16 tokens.
  const double block_gib =
      static_cast<double>(backend::KvCacheSpec{dtypes, 5, 16, 4, 8}.bytes_per_block()) /
      static_cast<double>(int64_t{1} << 30);
  check_invariance(base, 40, block_gib);  // 640 tokens for 64 sequences of up to ~150
}

// KIVI (groups of 32, a residual window of 16, so that every sequence stores groups quantized
// while it runs): the same, and the same whether a group was stored quantized or still held as
// residual rows when a query read it. Also K8V2.
class KiviBatchInvariance : public ::testing::TestWithParam<backend::KvDtypes> {};

TEST_P(KiviBatchInvariance, SameTokensAndLogitsHoweverScheduled) {
  EngineConfig base = testing_util::stories_config();
  base.cache.kv_dtypes = GetParam();
  base.cache.block_size = 32;
  base.cache.kivi_residual_length = 16;
  backend::KvCacheSpec spec{GetParam(), 5, 32, 4, 8};
  spec.kivi_residual_length = 16;
  const double block_gib =
      static_cast<double>(spec.bytes_per_block()) / static_cast<double>(int64_t{1} << 30);
  // Room for about two sequences of ~150 tokens held as residual rows.
  const int64_t per_group = spec.residual_blocks_per_group();
  check_invariance(base, 10 * per_group, block_gib, 2.5 * static_cast<double>(per_group));
}

INSTANTIATE_TEST_SUITE_P(
    KiviTypes, KiviBatchInvariance,
    ::testing::Values(backend::KvDtypes{backend::KvDtype::kKivi2, backend::KvDtype::kKivi2},
                      backend::KvDtypes{backend::KvDtype::kKivi4, backend::KvDtype::kKivi4},
                      backend::KvDtypes{backend::KvDtype::kInt8, backend::KvDtype::kKivi2}),
    [](const ::testing::TestParamInfo<backend::KvDtypes>& info) {
      return info.param.k == info.param.v ? std::string(kv_dtype_name(info.param.k))
                                          : std::string("int8_kivi2");
    });

INSTANTIATE_TEST_SUITE_P(EveryKvType, BatchInvariance, ::testing::ValuesIn(backend::kRowKvDtypes),
                         [](const ::testing::TestParamInfo<backend::KvDtype>& info) {
                           return std::string(backend::kv_dtype_name(info.param));
                         });

}  // namespace
}  // namespace vesper::engine
