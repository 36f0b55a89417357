// Engine behaviour on stories260K: parallel samples sharing prompt blocks, aborts in every state,
// admission errors, sampling fields (stop strings, min_tokens, logprobs, priorities), and a long
// randomized run with aborts checked for invariants after every step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <set>

#include "engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::make_engine;
using testing_util::run_to_completion;
using testing_util::stories_config;

std::vector<int32_t> encode(Engine& e, const std::string& text) {
  return e.tokenizer().encode(text, true, false);
}

using testing_util::greedy;

TEST(Engine, ParallelSamplesShareThePromptBlocks) {
  auto e = make_engine(stories_config());
  const auto prompt =
      encode(*e, "Once upon a time, there was a little girl named Lily. She loved to play");
  ASSERT_GT(prompt.size(), 16u);
  sample::SamplingParams p;
  p.n = 4;
  p.temperature = 1.0f;
  p.seed = 3;
  p.max_tokens = 20;
  p.ignore_eos = true;
  ASSERT_TRUE(e->add_request({"r", prompt, p}).ok());
  // The step that computes the prompt forks the samples; right after it, the four sequences
  // hold the prompt's full blocks once, plus a private copy of the partial last block each at most.
  const int64_t bs = e->memory_plan().block_size;
  const int64_t prompt_blocks = (static_cast<int64_t>(prompt.size()) + bs - 1) / bs;
  e->step();
  e->step();  // the children's first decode: copy-on-write of the shared partial block
  const auto s = e->stats();
  EXPECT_EQ(s.num_running, 4);
  EXPECT_LE(s.kv_blocks_used, prompt_blocks + 3 + 4) << "prompt blocks were not shared";
  EXPECT_LT(s.kv_blocks_used, 4 * prompt_blocks);
  auto done = run_to_completion(*e);
  ASSERT_EQ(done.size(), 1u);
  const auto& out = done.at("r");
  ASSERT_EQ(out.outputs.size(), 4u);
  std::set<std::vector<int32_t>> distinct;
  for (const auto& c : out.outputs) {
    EXPECT_EQ(c.token_ids.size(), 20u);
    EXPECT_EQ(c.finish_reason, "length");
    distinct.insert(c.token_ids);
  }
  EXPECT_GT(distinct.size(), 1u) << "parallel samples should differ at temperature 1";
  testing_util::expect_no_leaks(*e);
  e.reset();  // one engine at a time (a split job's rank 1 follows one: test_split.h)

  // Greedy parallel samples are all the single greedy continuation.
  auto g = make_engine(stories_config());
  sample::SamplingParams gp = greedy(20);
  gp.n = 3;
  ASSERT_TRUE(g->add_request({"n3", prompt, gp}).ok());
  ASSERT_TRUE(g->add_request({"n1", prompt, greedy(20)}).ok());
  auto gd = run_to_completion(*g);
  for (const auto& c : gd.at("n3").outputs)
    EXPECT_EQ(c.token_ids, gd.at("n1").outputs[0].token_ids);
  testing_util::expect_no_leaks(*g);
}

TEST(Engine, AbortInEveryStateFreesEverything) {
  EngineConfig c = stories_config();
  c.cache.num_gpu_blocks_override = 12;
  c.scheduler.max_num_batched_tokens = 8;
  c.scheduler.preemption_mode = sched::PreemptionMode::kSwap;
  auto e = make_engine(c);
  const auto long_prompt =
      encode(*e, testing_util::varied_prompts(64)[8] + " and then some more words to read");
  ASSERT_GT(long_prompt.size(), 20u);
  const auto short_prompt = encode(*e, "Hi");
  using Phase = Engine::Phase;
  std::set<Phase> aborted_in;
  // Each round adds requests, steps until one of them is in a phase not yet covered, aborts it
  // there and checks the bookkeeping.
  int next = 0;
  for (int round = 0; round < 400 && aborted_in.size() < 4; ++round) {
    if (e->stats().num_requests < 6) {
      const bool is_long = next % 2 == 0;
      ASSERT_TRUE(e->add_request({"r" + std::to_string(next), is_long ? long_prompt : short_prompt,
                                  greedy(is_long ? 80 : 150)})
                      .ok());
      ++next;
    }
    for (int i = 0; i < next; ++i) {
      const std::string id = "r" + std::to_string(i);
      const Phase ph = e->phase(id);
      if (ph == Phase::kUnknown || aborted_in.count(ph)) continue;
      ASSERT_TRUE(e->abort(id));
      EXPECT_EQ(e->phase(id), Phase::kUnknown);
      EXPECT_FALSE(e->abort(id));
      e->check_invariants();
      aborted_in.insert(ph);
    }
    e->step();
    e->check_invariants();
  }
  EXPECT_EQ(aborted_in.size(), 4u)
      << "not every state was reached (waiting, prefilling, decoding, swapped)";
  for (int i = 0; i < next; ++i) e->abort("r" + std::to_string(i));
  // A loop that plans ahead (async scheduling: 1 compute thread, as under a split; a pipeline's
  // plan a stage) still has the steps in flight to retire, and nothing after them.
  for (int i = 0; i < 4 && e->has_unfinished(); ++i) e->step();
  EXPECT_FALSE(e->has_unfinished());
  testing_util::expect_no_leaks(*e);
}

TEST(Engine, RejectsRequestsThatCanNeverFitAndKeepsServingOthers) {
  EngineConfig c = stories_config();
  c.cache.num_gpu_blocks_override = 8;  // 128 tokens in all
  c.scheduler.max_model_len = 200;
  auto e = make_engine(c);
  const auto prompt = encode(*e, "Once upon a time");
  ASSERT_TRUE(e->add_request({"ok", prompt, greedy(10)}).ok());
  auto too_long = e->add_request({"long", std::vector<int32_t>(201, 300), greedy(1)});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.error().message.find("--max-model-len 200"), std::string::npos)
      << too_long.error().message;
  auto too_big = e->add_request({"big", prompt, greedy(180)});
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.error().message.find("whole KV cache holds 8 blocks"), std::string::npos)
      << too_big.error().message;
  auto dup = e->add_request({"ok", prompt, greedy(1)});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.error().message.find("already in use"), std::string::npos);
  auto bad_token = e->add_request({"bad", {1, 99999}, greedy(1)});
  ASSERT_FALSE(bad_token.ok());
  EXPECT_NE(bad_token.error().message.find("99999"), std::string::npos);
  sample::SamplingParams bad = greedy(5);
  bad.top_p = 0;
  auto bad_params = e->add_request({"badp", prompt, bad});
  ASSERT_FALSE(bad_params.ok());
  EXPECT_NE(bad_params.error().message.find("top_p"), std::string::npos);
  auto done = run_to_completion(*e);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done.at("ok").outputs[0].token_ids.size(), 10u);
  testing_util::expect_no_leaks(*e);
}

TEST(Engine, StopStringsMinTokensStopTokensAndLogprobs) {
  auto e = make_engine(stories_config());
  const auto prompt = encode(*e, "Once upon a time");
  // Reference greedy run: ", there was a little girl named Lily. She loved to play ..."
  ASSERT_TRUE(e->add_request({"ref", prompt, greedy(32)}).ok());
  sample::SamplingParams stop = greedy(32);
  stop.stop = {"girl", "Lily"};
  ASSERT_TRUE(e->add_request({"stop", prompt, stop}).ok());
  sample::SamplingParams stop_incl = stop;
  stop_incl.include_stop_str_in_output = true;
  ASSERT_TRUE(e->add_request({"stop_incl", prompt, stop_incl}).ok());
  sample::SamplingParams stop_tok = greedy(32);
  stop_tok.stop_token_ids = {298};  // the sixth greedy token (" gir" of " girl")
  ASSERT_TRUE(e->add_request({"stop_tok", prompt, stop_tok}).ok());
  sample::SamplingParams lp = greedy(8);
  lp.logprobs = 3;
  ASSERT_TRUE(e->add_request({"logprobs", prompt, lp}).ok());
  std::map<std::string, std::string> streamed;
  std::map<std::string, RequestOutput> done;
  while (e->has_unfinished()) {
    for (auto& out : e->step()) {
      streamed[out.request_id] += out.outputs[0].delta_text;
      if (out.finished) done[out.request_id] = out;
    }
  }
  const std::string ref = done.at("ref").outputs[0].text;
  ASSERT_EQ(ref.rfind(", there was a little girl named Lily.", 0), 0u) << ref;
  EXPECT_EQ(done.at("stop").outputs[0].text, ", there was a little ");
  EXPECT_EQ(done.at("stop").outputs[0].finish_reason, "stop");
  EXPECT_EQ(done.at("stop").outputs[0].stop_string, "girl");
  EXPECT_EQ(done.at("stop_incl").outputs[0].text, ", there was a little girl");
  // Streaming never emitted text past the stop string (no retraction).
  EXPECT_EQ(streamed.at("stop"), done.at("stop").outputs[0].text);
  EXPECT_EQ(streamed.at("stop_incl"), done.at("stop_incl").outputs[0].text);
  EXPECT_EQ(streamed.at("ref"), ref);
  const auto& st = done.at("stop_tok").outputs[0];
  EXPECT_EQ(st.finish_reason, "stop");
  EXPECT_EQ(st.stop_token, 298);
  EXPECT_EQ(st.token_ids.back(), 298);
  EXPECT_EQ(st.text, ", there was a little");  // a stop token's text is not rendered
  const auto& l = done.at("logprobs").outputs[0];
  ASSERT_EQ(l.logprobs.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(l.logprobs[i].token, l.token_ids[i]);
    ASSERT_EQ(l.logprobs[i].top.size(), 3u);
    EXPECT_EQ(l.logprobs[i].top[0].token, l.token_ids[i]);  // greedy picks the top token
    EXPECT_FLOAT_EQ(l.logprobs[i].top[0].logprob, l.logprobs[i].logprob);
    EXPECT_LE(l.logprobs[i].logprob, 0.0f);
    EXPECT_GE(l.logprobs[i].top[0].logprob, l.logprobs[i].top[1].logprob);
  }
  testing_util::expect_no_leaks(*e);
}

TEST(Engine, MinTokensSuppressesStopTokensUntilReached) {
  auto e = make_engine(stories_config());
  const auto prompt = encode(*e, "Once upon a time");
  sample::SamplingParams p = greedy(20);
  p.ignore_eos = false;
  p.stop_token_ids = {432};  // the first greedy token (",")
  p.min_tokens = 3;
  ASSERT_TRUE(e->add_request({"r", prompt, p}).ok());
  auto done = run_to_completion(*e);
  const auto& out = done.at("r").outputs[0];
  EXPECT_GE(out.token_ids.size(), 3u);
  EXPECT_NE(out.token_ids[0], 432);
}

TEST(Engine, LowerPriorityValueIsServedFirst) {
  EngineConfig c = stories_config();
  c.scheduler.max_num_seqs = 1;
  auto e = make_engine(c);
  const auto prompt = encode(*e, "Hi");
  ASSERT_TRUE(e->add_request({"late", prompt, greedy(3), /*priority=*/5}).ok());
  ASSERT_TRUE(e->add_request({"early", prompt, greedy(3), /*priority=*/-1}).ok());
  std::vector<std::string> order;
  while (e->has_unfinished())
    for (auto& out : e->step())
      if (out.finished) order.push_back(out.request_id);
  EXPECT_EQ(order, (std::vector<std::string>{"early", "late"}));
}

TEST(Engine, MaxTokensZeroFinishesAtOnce) {
  auto e = make_engine(stories_config());
  sample::SamplingParams p = greedy(0);
  ASSERT_TRUE(e->add_request({"z", encode(*e, "Hi"), p}).ok());
  auto outs = e->step();
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(outs[0].finished);
  EXPECT_EQ(outs[0].outputs[0].finish_reason, "length");
  EXPECT_TRUE(outs[0].outputs[0].token_ids.empty());
}

// 2,000 requests with random prompt and output lengths, random priorities and random aborts,
// through a small KV cache in both preemption modes; invariants checked after every step.
TEST(EngineLongRun, TwoThousandRandomRequestsWithAborts) {
  const uint64_t seed = ::testing::UnitTest::GetInstance()->random_seed() + 12345;
  std::printf("  seed %llu\n", static_cast<unsigned long long>(seed));
  for (auto mode : {sched::PreemptionMode::kRecompute, sched::PreemptionMode::kSwap}) {
    EngineConfig c = stories_config();
    c.cache.num_gpu_blocks_override = 48;
    c.cache.block_size = 8;
    c.cache.swap_space_gib = 0.001;
    c.scheduler.max_num_batched_tokens = 64;
    c.scheduler.max_num_seqs = 24;
    c.scheduler.max_model_len = 256;
    c.scheduler.preemption_mode = mode;
    auto e = make_engine(c);
    std::mt19937_64 rng(seed);
    // Per mode: 2,000 in all; 600 under the sanitizers (the asan test preset sets
    // VESPER_SANITIZED), whose run checks memory, not volume.
    const int total = testing_util::sanitized() ? 300 : 1000;
    int added = 0, finished = 0, aborted = 0;
    std::set<std::string> live;
    for (int64_t step = 0; (added < total || e->has_unfinished()) && step < 200000; ++step) {
      for (int k = 0; k < 3 && added < total; ++k) {
        std::vector<int32_t> prompt(1 + rng() % 60);
        prompt[0] = 1;
        for (size_t i = 1; i < prompt.size(); ++i)
          prompt[i] = 3 + static_cast<int32_t>(rng() % 500);
        sample::SamplingParams p;
        p.temperature = (rng() % 2) ? 0.0f : 0.8f;
        p.seed = rng();
        p.max_tokens = 1 + static_cast<int64_t>(rng() % 40);
        p.n = (rng() % 10 == 0) ? 2 : 1;
        p.ignore_eos = true;
        const std::string id = std::to_string(added++);
        ASSERT_TRUE(e->add_request({id, prompt, p, static_cast<int32_t>(rng() % 3)}).ok());
        live.insert(id);
      }
      if (!live.empty() && rng() % 5 == 0) {
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
        for (const auto& o : out.outputs) ASSERT_TRUE(o.finish_reason == "length");
      }
      e->check_invariants();
      const auto s = e->stats();
      ASSERT_LE(s.max_batched_tokens_seen, 64);
      ASSERT_LE(s.kv_blocks_used, s.kv_blocks_total);
    }
    EXPECT_EQ(finished + aborted, total);
    EXPECT_GT(e->stats().num_preemptions, 0);
    testing_util::expect_no_leaks(*e);
  }
}

}  // namespace
}  // namespace vesper::engine
