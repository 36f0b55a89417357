// Batch invariance through the engine: 64 prompts of varied lengths on stories260K, greedy, 48
// tokens each, give identical token ids and bit-identical logprobs (so identical logits) when run
// one at a time, all at once, with a tiny token budget (chunked prefill), and with a KV cache so
// small that sequences are preempted by recompute and by swap. Each run asserts that the feature
// it exercises actually happened.
#include <gtest/gtest.h>

#include <cstring>

#include "engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::make_engine;
using testing_util::run_to_completion;

struct RunResult {
  std::map<std::string, RequestOutput> outputs;
  EngineStats stats;
};

RunResult run_all(const EngineConfig& config, const std::vector<std::string>& prompts) {
  auto e = make_engine(config);
  EXPECT_NE(e, nullptr);
  sample::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 48;
  p.ignore_eos = true;
  p.logprobs = 2;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto ids = e->tokenizer().encode(prompts[i], true, false);
    auto st = e->add_request(std::to_string(i), ids, p);
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  RunResult r;
  r.outputs = run_to_completion(*e);
  r.stats = e->stats();
  testing_util::expect_no_leaks(*e);
  return r;
}

void expect_same(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size()) << what;
  for (const auto& [id, out] : a.outputs) {
    const auto& other = b.outputs.at(id);
    ASSERT_EQ(out.outputs[0].token_ids, other.outputs[0].token_ids) << what << ", request " << id;
    ASSERT_EQ(out.outputs[0].logprobs.size(), other.outputs[0].logprobs.size());
    for (size_t t = 0; t < out.outputs[0].logprobs.size(); ++t) {
      const auto& x = out.outputs[0].logprobs[t];
      const auto& y = other.outputs[0].logprobs[t];
      ASSERT_EQ(0, std::memcmp(&x.logprob, &y.logprob, sizeof(float))) << what << ", request " << id << " token " << t;
      for (size_t k = 0; k < x.top.size(); ++k)
        ASSERT_EQ(0, std::memcmp(&x.top[k].logprob, &y.top[k].logprob, sizeof(float)))
            << what << ", request " << id << " token " << t;
    }
  }
}

TEST(BatchInvariance, SameTokensAndLogitsHoweverScheduled) {
  const auto prompts = testing_util::varied_prompts(64);

  EngineConfig one = testing_util::stories_config();
  one.scheduler.max_num_seqs = 1;
  const RunResult alone = run_all(one, prompts);
  EXPECT_EQ(alone.stats.num_preemptions, 0);

  const RunResult together = run_all(testing_util::stories_config(), prompts);
  EXPECT_LT(together.stats.num_steps, alone.stats.num_steps / 10) << "requests were not batched";
  expect_same(alone, together, "all at once");

  EngineConfig chunked = testing_util::stories_config();
  chunked.scheduler.max_num_batched_tokens = 16;
  const RunResult small_budget = run_all(chunked, prompts);
  EXPECT_GT(small_budget.stats.num_chunked_prefill_steps, 0) << "no prompt was split";
  EXPECT_LE(small_budget.stats.max_batched_tokens_seen, 16);
  expect_same(alone, small_budget, "max-num-batched-tokens 16");

  EngineConfig recompute = testing_util::stories_config();
  recompute.cache.num_gpu_blocks_override = 40;  // 640 tokens for 64 sequences of up to ~150
  recompute.scheduler.preemption_mode = sched::PreemptionMode::kRecompute;
  const RunResult preempted = run_all(recompute, prompts);
  EXPECT_GT(preempted.stats.num_recomputes, 0) << "nothing was preempted";
  expect_same(alone, preempted, "preemption by recompute");

  EngineConfig swap = recompute;
  swap.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  swap.cache.swap_space_gib = 0.01;  // ~500 blocks of stories260K
  const RunResult swapped = run_all(swap, prompts);
  EXPECT_GT(swapped.stats.num_swap_outs, 0) << "nothing was swapped";
  expect_same(alone, swapped, "preemption by swap");

  EngineConfig both = recompute;
  both.scheduler.max_num_batched_tokens = 24;
  both.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  both.cache.swap_space_gib = 0.0002;  // a few blocks: swap falls back to recompute
  const RunResult mixed = run_all(both, prompts);
  EXPECT_GT(mixed.stats.num_swap_outs, 0);
  EXPECT_GT(mixed.stats.num_recomputes, 0);
  expect_same(alone, mixed, "small budget, swap with recompute fallback");
}

}  // namespace
}  // namespace vesper::engine
