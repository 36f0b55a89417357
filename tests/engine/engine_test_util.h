// Helpers for engine tests on stories260K: engine creation with overrides, prompt sets, and
// running a set of requests to completion while checking invariants after every step.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "sanitized.h"
#include "test_split.h"

namespace vesper::testing_util {

inline const char* kStoriesLong = "../shared/models/stories260K-f32.gguf";

inline engine::EngineConfig stories_config() {
  engine::EngineConfig c;
  c.model_path = kStoriesLong;
  c.threads = 2;
  c.cache.num_gpu_blocks_override = 1024;
  c.cache.swap_space_gib = 0.01;
  c.scheduler.max_model_len = 512;
  return c;
}

// The three proposers on stories260K, `k` proposals a step.
// Prompt lookup, n-grams of 1 to 3 tokens.
inline engine::EngineConfig with_ngram(engine::EngineConfig c, int64_t k = 4) {
  c.speculative.method = spec::SpeculativeConfig::Method::kNgram;
  c.speculative.num_speculative_tokens = k;
  c.speculative.ngram = spec::NgramConfig{1, 3};
  return c;
}

// ../shared/models/stories-draft.gguf: distilled from stories260K, same vocabulary.
inline engine::EngineConfig with_draft(engine::EngineConfig c, int64_t k = 4) {
  c.speculative.method = spec::SpeculativeConfig::Method::kDraftModel;
  c.speculative.model = "../shared/models/stories-draft.gguf";
  c.speculative.num_speculative_tokens = k;
  return c;
}

// Medusa heads trained on stories260K (../shared/models/medusa): a tree of candidates, or a chain.
inline engine::EngineConfig with_medusa(engine::EngineConfig c, int64_t k = 4, bool tree = true) {
  c.speculative.method = spec::SpeculativeConfig::Method::kMedusa;
  c.speculative.model = "../shared/models/medusa";
  c.speculative.num_speculative_tokens = k;
  c.speculative.medusa_tree = tree;
  return c;
}

// One process's engine, under a split too: a reference beside the split engine under test, or a
// tokenizer that lives as long as the test program.
inline std::unique_ptr<engine::Engine> make_unsplit_engine(const engine::EngineConfig& c) {
  auto e = engine::Engine::create(c);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(*e) : nullptr;
}

// Under VESPER_TEST_SPLIT (test_split.h) the engine is split across the mpirun job; one such
// engine at a time.
inline std::unique_ptr<engine::Engine> make_engine(engine::EngineConfig c) {
  split_engine(c);
  auto e = make_unsplit_engine(c);
  // Rank 1 was told to follow this engine and waits in its model's loop: a job that went on
  // would read the next test's messages as commands. End it here, naming the test.
  if (e == nullptr && test_split().world != nullptr) {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    test_split().world->abort(std::string("a split engine failed to build in ") +
                              (test != nullptr ? test->name() : "a test"));
  }
  return e;
}

// Runs until every request finished; returns the final output of each request by id. Checks
// the engine's invariants after every step.
inline std::map<std::string, engine::RequestOutput> run_to_completion(engine::Engine& e,
                                                                      int64_t max_steps = 100000) {
  std::map<std::string, engine::RequestOutput> done;
  for (int64_t step = 0; e.has_unfinished(); ++step) {
    EXPECT_LT(step, max_steps) << "engine did not finish";
    if (step >= max_steps) break;
    for (auto& out : e.step())
      if (out.finished) done[out.request_id] = std::move(out);
    e.check_invariants();
  }
  return done;
}

// Checks that no KV block is held: every device block free, the swap pool empty.
inline void expect_no_leaks(const engine::Engine& e) {
  const auto s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0) << "device blocks leaked";
  EXPECT_EQ(s.swap_blocks_used, 0) << "swap blocks leaked";
  EXPECT_EQ(s.num_running + s.num_waiting + s.num_swapped, 0);
}

// 64 prompts of varied lengths made from story sentences.
inline std::vector<std::string> varied_prompts(int n = 64) {
  const std::vector<std::string> parts = {
      "Once upon a time",
      " there was a little girl named Lily.",
      " She loved to play outside in the park.",
      " One day, she saw a big red ball.",
      " Tom and his dog went to the beach.",
      " The sun was hot and bright.",
      " They found a shiny shell in the sand.",
      " Mom said it was time to go home.",
      " The cat was very hungry.",
      " Ben wanted to help his friend.",
  };
  std::vector<std::string> prompts;
  for (int i = 0; i < n; ++i) {
    std::string p = parts[i % 3 == 0 ? 0 : (i % parts.size())];
    const int extra = (i * 7) % 9;
    for (int k = 0; k < extra; ++k) p += parts[(i + k * 3) % parts.size()];
    prompts.push_back(p);
  }
  return prompts;
}

struct RunResult {
  std::map<std::string, engine::RequestOutput> outputs;
  engine::EngineStats stats;
};

// Greedy with EOS ignored, so that a request generates exactly max_tokens.
inline sample::SamplingParams greedy(int64_t max_tokens) {
  sample::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// The same with logprobs, so that comparing them compares logits bit for bit.
inline sample::SamplingParams greedy_params(int64_t max_tokens = 48) {
  sample::SamplingParams p = greedy(max_tokens);
  p.logprobs = 2;
  return p;
}

// Adds every prompt (request id = its index) at once and runs the engine to completion.
inline RunResult run_ids(const engine::EngineConfig& config,
                         const std::vector<std::vector<int32_t>>& prompts,
                         const sample::SamplingParams& params = greedy_params()) {
  auto e = make_engine(config);
  EXPECT_NE(e, nullptr);
  RunResult r;
  if (e == nullptr) return r;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto st = e->add_request({std::to_string(i), prompts[i], params});
    EXPECT_TRUE(st.ok()) << st.error().message;
  }
  r.outputs = run_to_completion(*e);
  r.stats = e->stats();
  expect_no_leaks(*e);
  return r;
}

inline RunResult run_texts(const engine::EngineConfig& config,
                           const std::vector<std::string>& prompts,
                           const sample::SamplingParams& params = greedy_params()) {
  std::vector<std::vector<int32_t>> ids;
  {
    // Gone before run_ids makes its own: under a split (test_split.h) rank 1 follows one engine
    // at a time.
    auto e = make_engine(config);
    if (e == nullptr) return {};
    for (const auto& p : prompts) ids.push_back(e->tokenizer().encode(p, true, false));
  }
  return run_ids(config, ids, params);
}

// Same token ids and bit-identical logprobs (sampled and top-k) for every request and sample.
inline void expect_same(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size()) << what;
  for (const auto& [id, out] : a.outputs) {
    const auto& other = b.outputs.at(id);
    ASSERT_EQ(out.outputs.size(), other.outputs.size()) << what << ", request " << id;
    for (size_t s = 0; s < out.outputs.size(); ++s) {
      const auto& x_out = out.outputs[s];
      const auto& y_out = other.outputs[s];
      ASSERT_EQ(x_out.token_ids, y_out.token_ids) << what << ", request " << id << " sample " << s;
      ASSERT_EQ(x_out.logprobs.size(), y_out.logprobs.size());
      for (size_t t = 0; t < x_out.logprobs.size(); ++t) {
        const auto& x = x_out.logprobs[t];
        const auto& y = y_out.logprobs[t];
        ASSERT_EQ(0, std::memcmp(&x.logprob, &y.logprob, sizeof(float)))
            << what << ", request " << id << " token " << t;
        for (size_t k = 0; k < x.top.size(); ++k)
          ASSERT_EQ(0, std::memcmp(&x.top[k].logprob, &y.top[k].logprob, sizeof(float)))
              << what << ", request " << id << " token " << t;
      }
    }
  }
}

}  // namespace vesper::testing_util
