// The engine loop's modes on stories260K: asynchronous output processing on and off, async
// scheduling on and off, and multi-step scheduling (--num-scheduler-steps 1, 2, 8, 16) give the
// same greedy tokens, and bit-identical logprobs, as the plain synchronous single-step loop, in
// every scheduling mode the invariance tests cover (batching, chunked prefill, preemption by
// recompute and by swap, prefix caching, n > 1) and with every proposer, LoRA, a grammar and KIVI.
// max_tokens, stop tokens and stop strings end at the same token (the tokens a later step computed
// are discarded: not reported, not counted), and aborts mid-run free every block. Each run asserts
// that the mode it is about actually happened.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <span>

#include "engine/engine_test_util.h"
#include "engine/grammar_vocabulary.h"
#include "grammar/gbnf.h"

namespace vesper::engine {
namespace {

using testing_util::expect_same;
using testing_util::RunResult;
using testing_util::with_draft;
using testing_util::with_medusa;
using testing_util::with_ngram;

// One way to run the engine loop.
struct Loop {
  const char* name;
  bool async_output;
  bool async_scheduling;
  int64_t steps;  // --num-scheduler-steps
};

const Loop kSync{"synchronous, single-step", false, false, 1};
const Loop kLoops[] = {
    {"async output", true, false, 1},
    {"async scheduling", false, true, 1},
    {"async output and scheduling", true, true, 1},
    {"2 steps", false, false, 2},
    {"8 steps, async output", true, false, 8},
    {"16 steps, async output and scheduling", true, true, 16},
};
// Speculative decoding and adapters plan from each step's results: no async scheduling.
const Loop kLoopsInOrder[] = {
    {"async output", true, false, 1},
    {"2 steps", false, false, 2},
    {"8 steps, async output", true, false, 8},
};

// Under a sanitizer (testing_util::sanitized()) half the loops run: each mode (async output, async
// scheduling, multi-step) still in one of them.
std::span<const Loop> every_loop() {
  static const Loop kSanitized[] = {kLoops[2], kLoops[4], kLoops[5]};
  return testing_util::sanitized() ? std::span<const Loop>(kSanitized)
                                   : std::span<const Loop>(kLoops);
}
std::span<const Loop> every_loop_in_order() {
  static const Loop kSanitized[] = {kLoopsInOrder[0], kLoopsInOrder[2]};
  return testing_util::sanitized() ? std::span<const Loop>(kSanitized)
                                   : std::span<const Loop>(kLoopsInOrder);
}

EngineConfig with_loop(EngineConfig c, const Loop& loop) {
  c.async_output = loop.async_output;
  c.async_scheduling = loop.async_scheduling ? EngineConfig::AsyncScheduling::kOn
                                             : EngineConfig::AsyncScheduling::kOff;
  c.scheduler.num_scheduler_steps = loop.steps;
  return c;
}

// The modes that batch, chunk and preempt: all at once; a 16-token budget and a KV cache of
// `small_blocks` blocks (chunked prefill, preemption by swap falling back to recompute).
EngineConfig squeezed(EngineConfig c, int64_t small_blocks) {
  c.scheduler.max_num_batched_tokens = 16;
  c.cache.num_gpu_blocks_override = small_blocks;
  c.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  c.cache.swap_space_gib = 0.00002;  // two blocks: swap, then recompute when they are taken
  return c;
}

void expect_multi_step_ran(const RunResult& r, const Loop& loop, const std::string& what) {
  if (loop.steps > 1) {
    EXPECT_GT(r.stats.num_passes, r.stats.num_steps) << what << ": no multi-step plan";
  }
}

// Every loop against the synchronous single-step loop, all at once and squeezed; the prompts twice
// (prefix-cache hits) and n = 2.
TEST(EngineLoop, GreedyOutputIsTheSameInEveryLoopAndSchedulingMode) {
  auto prompts = testing_util::varied_prompts(12);
  prompts.insert(prompts.end(), prompts.begin(), prompts.begin() + 6);
  const sample::SamplingParams one = testing_util::greedy_params(32);
  sample::SamplingParams two = one;
  two.n = 2;
  const EngineConfig base = testing_util::stories_config();
  const RunResult ref = testing_util::run_texts(with_loop(base, kSync), prompts, one);
  const RunResult ref_two = testing_util::run_texts(with_loop(base, kSync), prompts, two);
  for (const Loop& loop : every_loop()) {
    const std::string what = loop.name;
    const RunResult together = testing_util::run_texts(with_loop(base, loop), prompts, one);
    EXPECT_GT(together.stats.prefix_cache_hits, 0) << what;
    expect_multi_step_ran(together, loop, what);
    expect_same(ref, together, what + ", all at once");
    const RunResult tight =
        testing_util::run_texts(with_loop(squeezed(base, 24), loop), prompts, one);
    EXPECT_GT(tight.stats.num_chunked_prefill_steps, 0) << what;
    EXPECT_GT(tight.stats.num_swap_outs, 0) << what;
    EXPECT_GT(tight.stats.num_recomputes, 0) << what;
    expect_same(ref, tight, what + ", chunked and preempted");
    const RunResult forked = testing_util::run_texts(with_loop(base, loop), prompts, two);
    expect_same(ref_two, forked, what + ", n = 2");
  }
}

EngineConfig with_kivi(EngineConfig c) {
  c.cache.kv_dtypes = {backend::KvDtype::kKivi2, backend::KvDtype::kKivi2};
  c.cache.block_size = 32;
  c.cache.kivi_residual_length = 16;
  return c;
}

// A feature against itself in the synchronous single-step loop, in each loop that applies to it,
// all at once and squeezed into `small_blocks` blocks.
void expect_feature_loop_invariant(const std::string& feature, const EngineConfig& base,
                                   std::span<const Loop> loops, int64_t small_blocks,
                                   const std::function<RunResult(const EngineConfig&)>& run,
                                   const std::function<void(const RunResult&)>& check = {}) {
  const RunResult ref = run(with_loop(base, kSync));
  if (check) check(ref);
  for (const Loop& loop : loops) {
    const std::string what = feature + ", " + loop.name;
    const RunResult together = run(with_loop(base, loop));
    expect_same(ref, together, what + ", all at once");
    if (check) check(together);
    const RunResult tight = run(with_loop(squeezed(base, small_blocks), loop));
    EXPECT_GT(tight.stats.num_preemptions, 0) << what << ": nothing was preempted";
    expect_same(ref, tight, what + ", chunked and preempted");
  }
}

TEST(EngineLoop, ProposersKeepTheTargetsOutputInEveryLoop) {
  auto prompts = testing_util::varied_prompts(10);
  prompts.push_back("Lily had a red ball. Lily had a red ball. Lily had a");
  const auto run = [&](const EngineConfig& c) { return testing_util::run_texts(c, prompts); };
  const auto speculated = [](const RunResult& r) {
    EXPECT_GT(r.stats.spec_num_accepted_tokens, 0) << "nothing was accepted";
  };
  const EngineConfig base = testing_util::stories_config();
  expect_feature_loop_invariant("n-gram", with_ngram(base), every_loop_in_order(), 28, run,
                                speculated);
  expect_feature_loop_invariant("draft model", with_draft(base), every_loop_in_order(), 28, run,
                                speculated);
  expect_feature_loop_invariant("Medusa tree", with_medusa(base, 6), every_loop_in_order(), 20, run,
                                speculated);
}

TEST(EngineLoop, AdaptersGrammarAndKiviKeepTheirOutputInEveryLoop) {
  const auto prompts = testing_util::varied_prompts(10);
  // Adapters: every prompt under zed (LoRA), vzed (VeRA) and the base model.
  EngineConfig lora = testing_util::stories_config();
  lora.model_path = "../shared/models/stories260K.gguf";
  lora.scheduler.max_model_len = 128;
  lora.lora.enable_lora = true;
  lora.lora.max_loras = 2;
  lora.lora.max_lora_rank = 32;
  lora.lora.modules = {{"zed", "../shared/models/lora/zed/adapter.gguf", ""},
                       {"vzed", "../shared/models/vera/zed", ""}};
  // (stories260K.gguf's context is 128 tokens: short prompts.)
  const std::vector<std::string> short_prompts = {
      "Once upon a time",
      "One day, a little girl named",
      "Once upon a time, there was a boy named",
      "Tom and his dog went to the beach. The sun was",
      "The cat was very hungry.",
      "Ben wanted to help his friend. Mom said it was time to go home."};
  const auto run_adapters = [&](const EngineConfig& c) {
    auto e = testing_util::make_engine(c);
    RunResult r;
    if (!e) return r;
    for (const char* a : {"zed", "vzed", ""})
      for (size_t i = 0; i < short_prompts.size(); ++i) {
        EngineRequest req{std::string(a) + "|" + std::to_string(i),
                          e->tokenizer().encode(short_prompts[i], true, false),
                          testing_util::greedy_params(24)};
        req.lora_name = a;
        const Status st = e->add_request(std::move(req));
        EXPECT_TRUE(st.ok()) << st.error().message;
      }
    r.outputs = testing_util::run_to_completion(*e);
    r.stats = e->stats();
    testing_util::expect_no_leaks(*e);
    return r;
  };
  expect_feature_loop_invariant("adapters", lora, every_loop_in_order(), 24, run_adapters);

  // A grammar: words and punctuation only (the masks follow each sequence's own output).
  const EngineConfig base = testing_util::stories_config();
  auto words = grammar::parse_gbnf("root ::= [ a-zA-Z.,]*");
  ASSERT_TRUE(words.ok());
  auto probe = testing_util::make_engine(base);
  ASSERT_NE(probe, nullptr);
  sample::SamplingParams constrained = testing_util::greedy_params(32);
  constrained.grammar = std::make_shared<const grammar::CompiledGrammar>(
      *words, grammar_vocabulary(probe->tokenizer()));
  probe.reset();
  const auto run_grammar = [&](const EngineConfig& c) {
    return testing_util::run_texts(c, prompts, constrained);
  };
  expect_feature_loop_invariant("grammar", base, every_loop(), 24, run_grammar);
  // Masks computed ahead on the prefetching thread (the default) or by each step: the same
  // outputs. A bounded repetition, so that every position is a state of its own, and a fresh
  // grammar per run, so that its masks are computed in the run.
  auto bounded = grammar::parse_gbnf("root ::= [ a-zA-Z.,]{0,150}");
  ASSERT_TRUE(bounded.ok());
  sample::SamplingParams counted = constrained;
  const auto run_bounded = [&](const EngineConfig& c) {
    counted.grammar = std::make_shared<const grammar::CompiledGrammar>(
        *bounded, constrained.grammar->vocabulary_ptr());
    return testing_util::run_texts(c, prompts, counted);
  };
  EngineConfig stepped = base;
  stepped.prefetch_grammar_masks = false;
  const RunResult ahead = run_bounded(base);
  const RunResult on_step = run_bounded(stepped);
  testing_util::expect_same(ahead, on_step, "grammar masks prefetched or not");
  EXPECT_GT(ahead.stats.grammar_masks_prefetched, 0);
  EXPECT_EQ(on_step.stats.grammar_masks_prefetched, 0);

  // KIVI (kivi2, groups of 32, a residual window of 16: groups are stored quantized as they run).
  backend::KvCacheSpec spec{with_kivi(base).cache.kv_dtypes, 5, 32, 4, 8};
  spec.kivi_residual_length = 16;
  const auto run_kivi = [&](const EngineConfig& c) { return testing_util::run_texts(c, prompts); };
  expect_feature_loop_invariant(
      "kivi2", with_kivi(base), every_loop(), 8 * spec.residual_blocks_per_group(), run_kivi,
      [](const RunResult& r) { EXPECT_GT(r.stats.kivi_groups_quantized, 0); });
}

// Stop strings, stop tokens, EOS and max_tokens end every loop's output at the token the
// synchronous single-step loop ends it; what a later step computed is neither reported nor
// counted, and its blocks go back.
TEST(EngineLoop, StopsEndTheOutputWhereTheSynchronousLoopEndsIt) {
  const auto prompts = testing_util::varied_prompts(12);
  std::vector<sample::SamplingParams> params;
  for (int i = 0; i < 4; ++i) {
    sample::SamplingParams p = testing_util::greedy_params(40);
    if (i == 0) p.stop = {"park", " the", "Lily"};
    if (i == 1) p.stop_token_ids = {298, 5};
    if (i == 2) p.ignore_eos = false;  // EOS ends it
    if (i == 3) p.max_tokens = 7;
    params.push_back(p);
  }
  auto run = [&](const EngineConfig& c, std::map<std::string, std::string>& streamed) {
    auto e = testing_util::make_engine(c);
    RunResult r;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_TRUE(e->add_request({std::to_string(i), e->tokenizer().encode(prompts[i], true, false),
                                  params[i % params.size()]})
                      .ok());
    while (e->has_unfinished()) {
      for (auto& out : e->step()) {
        streamed[out.request_id] += out.outputs[0].delta_text;
        if (out.finished) r.outputs[out.request_id] = std::move(out);
      }
      e->check_invariants();
    }
    r.stats = e->stats();
    testing_util::expect_no_leaks(*e);
    int64_t reported = 0;
    for (const auto& [id, out] : r.outputs)
      reported += static_cast<int64_t>(out.outputs[0].token_ids.size());
    EXPECT_EQ(r.stats.generation_tokens, reported) << "discarded tokens were counted";
    return r;
  };
  std::map<std::string, std::string> ref_streamed;
  const RunResult ref = run(with_loop(testing_util::stories_config(), kSync), ref_streamed);
  std::set<std::string> reasons;
  for (const auto& [id, out] : ref.outputs) reasons.insert(*out.outputs[0].finish_reason);
  EXPECT_EQ(reasons, (std::set<std::string>{"length", "stop"}));
  for (const Loop& loop : every_loop()) {
    std::map<std::string, std::string> streamed;
    const RunResult r = run(with_loop(testing_util::stories_config(), loop), streamed);
    expect_same(ref, r, loop.name);
    for (const auto& [id, out] : ref.outputs) {
      const CompletionOutput& a = out.outputs[0];
      const CompletionOutput& b = r.outputs.at(id).outputs[0];
      EXPECT_EQ(a.text, b.text) << loop.name << ", request " << id;
      EXPECT_EQ(a.finish_reason, b.finish_reason) << loop.name << ", request " << id;
      EXPECT_EQ(a.stop_string, b.stop_string) << loop.name << ", request " << id;
      EXPECT_EQ(a.stop_token, b.stop_token) << loop.name << ", request " << id;
      EXPECT_EQ(streamed.at(id), b.text) << loop.name << ": streamed text past the end";
    }
  }
}

// Random requests (sampled and greedy, n = 2 now and then) with aborts at random moments, in the
// loop that runs furthest ahead: every step's invariants hold, and nothing is left at the end.
TEST(EngineLoop, AbortsMidRunFreeEveryBlockInEveryLoop) {
  const uint64_t seed = ::testing::UnitTest::GetInstance()->random_seed() + 777;
  std::printf("  seed %llu\n", static_cast<unsigned long long>(seed));
  for (const Loop& loop : {kLoops[2], kLoops[5]}) {
    EngineConfig c = testing_util::stories_config();
    c.cache.num_gpu_blocks_override = 40;
    c.cache.block_size = 8;
    c.scheduler.max_num_batched_tokens = 48;
    c.scheduler.max_num_seqs = 16;
    c.scheduler.max_model_len = 256;
    c.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
    auto e = testing_util::make_engine(with_loop(c, loop));
    std::mt19937_64 rng(seed);
    const int total = 200;
    int added = 0, finished = 0, aborted = 0;
    std::set<std::string> live;
    for (int64_t step = 0; (added < total || e->has_unfinished()) && step < 100000; ++step) {
      for (int k = 0; k < 2 && added < total; ++k) {
        std::vector<int32_t> prompt(1 + rng() % 50);
        prompt[0] = 1;
        for (size_t i = 1; i < prompt.size(); ++i)
          prompt[i] = 3 + static_cast<int32_t>(rng() % 500);
        sample::SamplingParams p;
        p.temperature = (rng() % 2) ? 0.0f : 0.8f;
        p.seed = rng();
        p.max_tokens = 1 + static_cast<int64_t>(rng() % 40);
        p.n = (rng() % 8 == 0) ? 2 : 1;
        p.ignore_eos = true;
        const std::string id = std::to_string(added++);
        ASSERT_TRUE(e->add_request({id, prompt, p}).ok());
        live.insert(id);
      }
      if (!live.empty() && rng() % 4 == 0) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        RequestOutput last;
        ASSERT_TRUE(e->abort(*it, &last)) << loop.name;
        EXPECT_TRUE(last.finished);
        live.erase(it);
        ++aborted;
      }
      for (auto& out : e->step()) {
        if (!out.finished) continue;
        ASSERT_EQ(live.count(out.request_id), 1u) << loop.name << ": an aborted request finished";
        ++finished;
        live.erase(out.request_id);
      }
      e->check_invariants();
    }
    EXPECT_EQ(finished + aborted, total) << loop.name;
    EXPECT_GT(e->stats().num_preemptions, 0) << loop.name;
    testing_util::expect_no_leaks(*e);
  }
}

}  // namespace
}  // namespace vesper::engine
