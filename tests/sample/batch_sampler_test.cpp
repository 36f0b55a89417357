// BatchSampler against the per-sequence Sampler: many sequences with different parameters
// (penalties, logit_bias, allowed_token_ids, bad words),
// histories and seeds share one scratch and must draw exactly what each would alone; the
// scratch is left clean between rows (a penalty never leaks into the next sequence); logprobs;
// a batch spread over a thread pool draws what one thread draws.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"

namespace vesper::sample {
namespace {

constexpr int32_t kVocab = 517;  // odd, past a multiple of the argmax lanes

SamplingParams random_params(std::mt19937& rng, uint64_t seed) {
  SamplingParams p;
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  p.temperature = rng() % 4 == 0 ? 0.0f : 0.3f + 1.5f * u(rng);
  p.top_k = rng() % 3 == 0 ? static_cast<int32_t>(1 + rng() % 50) : -1;
  p.top_p = rng() % 3 == 0 ? 0.5f + 0.5f * u(rng) : 1.0f;
  p.min_p = rng() % 4 == 0 ? 0.1f * u(rng) : 0.0f;
  p.repetition_penalty = rng() % 2 ? 1.0f + u(rng) : 1.0f;
  p.presence_penalty = rng() % 2 ? 2.0f * u(rng) - 1.0f : 0.0f;
  p.frequency_penalty = rng() % 2 ? 2.0f * u(rng) - 1.0f : 0.0f;
  p.min_tokens = static_cast<int64_t>(rng() % 4);
  p.stop_token_ids = {static_cast<int32_t>(rng() % kVocab)};
  if (rng() % 3 == 0)
    for (int i = 0; i < 5; ++i)
      p.logit_bias.emplace_back(static_cast<int32_t>(rng() % kVocab), 200.0f * u(rng) - 100.0f);
  if (rng() % 4 == 0)
    for (int i = 0; i < 60; ++i)
      p.allowed_token_ids.push_back(static_cast<int32_t>(rng() % kVocab));
  // Bad words over a small alphabet, so that outputs do end with their prefixes.
  if (rng() % 3 == 0)
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> word(1 + rng() % 3);
      for (int32_t& t : word) t = static_cast<int32_t>(rng() % 8);
      p.bad_words_token_ids.push_back(word);
    }
  p.seed = seed;
  return p;
}

TEST(BatchSampler, DrawsWhatEachSequenceDrawsAlone) {
  const uint64_t seed = 20261202;
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr int kSeqs = 24, kSteps = 30;
  const std::vector<int32_t> eog = {2, 7};
  std::normal_distribution<float> logit(0.0f, 3.0f);

  std::vector<SamplingParams> params;
  std::vector<std::vector<int32_t>> prompts, outputs_batched(kSeqs), outputs_alone(kSeqs);
  std::vector<std::mt19937_64> rngs;
  std::vector<Sampler> alone;
  for (int s = 0; s < kSeqs; ++s) {
    params.push_back(random_params(rng, 1000 + s));
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
    prompts.push_back(prompt);
    rngs.push_back(make_rng(params.back()));
    alone.emplace_back(params.back());
  }
  BatchSampler batch(kVocab);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<float>> rows(kSeqs, std::vector<float>(kVocab));
    for (auto& row : rows)
      for (float& x : row) x = logit(rng);
    // Batched: every row in one call.
    std::vector<std::vector<float>> batched_rows = rows;
    std::vector<BatchSampler::Row> batch_rows;
    for (int s = 0; s < kSeqs; ++s)
      batch_rows.push_back({&params[s], &rngs[s], TokenHistory{prompts[s], outputs_batched[s]},
                            rows[s], nullptr, batched_rows[s]});
    std::vector<int32_t> tokens(kSeqs);
    batch.sample(batch_rows, eog, tokens);
    // Alone: the reference sampler, with min_tokens applied as the engine applies it.
    for (int s = 0; s < kSeqs; ++s) {
      std::vector<float> row = rows[s];
      apply_min_tokens(params[s], static_cast<int64_t>(outputs_alone[s].size()), eog, row);
      const int32_t t = alone[s].sample(row, prompts[s], outputs_alone[s]);
      ASSERT_EQ(tokens[s], t) << "sequence " << s << " step " << step;
      // The processed rows are the same too.
      for (int32_t v = 0; v < kVocab; ++v) {
        if (std::isnan(row[v]) && std::isnan(batched_rows[s][v])) continue;
        ASSERT_EQ(row[v], batched_rows[s][v]);
      }
      outputs_alone[s].push_back(t);
      outputs_batched[s].push_back(tokens[s]);
    }
  }
}

TEST(BatchSampler, RowsSpreadOverThreadsDrawWhatOneThreadDraws) {
  const uint64_t seed = 20261205;
  std::mt19937 rng(seed);
  constexpr int kSeqs = 37, kSteps = 12;
  const std::vector<int32_t> eog = {2, 7};
  std::normal_distribution<float> logit(0.0f, 3.0f);
  std::vector<SamplingParams> params;
  std::vector<std::vector<int32_t>> prompts, outputs(kSeqs);
  std::vector<std::mt19937_64> one_rngs, pool_rngs;
  for (int s = 0; s < kSeqs; ++s) {
    params.push_back(random_params(rng, 500 + s));
    params.back().logprobs = s % 2 == 0 ? 3 : -1;
    prompts.push_back({static_cast<int32_t>(rng() % kVocab)});
    one_rngs.push_back(make_rng(params.back()));
    pool_rngs.push_back(make_rng(params.back()));
  }
  ThreadPool pool(3);
  BatchSampler one(kVocab), spread(kVocab, &pool);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::vector<float>> logits(kSeqs, std::vector<float>(kVocab));
    for (auto& row : logits)
      for (float& x : row) x = logit(rng);
    std::vector<LogprobEntry> one_lp(kSeqs), pool_lp(kSeqs);
    std::vector<BatchSampler::Row> one_rows, pool_rows;
    for (int s = 0; s < kSeqs; ++s) {
      const TokenHistory history{prompts[s], outputs[s]};
      one_rows.push_back({&params[s], &one_rngs[s], history, logits[s], &one_lp[s]});
      pool_rows.push_back({&params[s], &pool_rngs[s], history, logits[s], &pool_lp[s]});
    }
    std::vector<int32_t> a(kSeqs), b(kSeqs);
    one.sample(one_rows, eog, a);
    spread.sample(pool_rows, eog, b);
    ASSERT_EQ(a, b) << "step " << step;
    for (int s = 0; s < kSeqs; ++s) {
      ASSERT_EQ(one_lp[s].logprob, pool_lp[s].logprob) << "sequence " << s << " step " << step;
      ASSERT_EQ(one_lp[s].top.size(), pool_lp[s].top.size());
      outputs[s].push_back(a[s]);
    }
  }
}

TEST(ExpNonpositive, MatchesExpWithinTwoUlpsAndIsZeroBelowFloatsRange) {
  double worst = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double got = exp_nonpositive(x);
    worst = std::max(worst, std::abs(got - want) / want);
  }
  EXPECT_LT(worst, 2.4e-7) << "relative error (2 ulp is 2.4e-7)";
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-INFINITY), 0.0f);
}

TEST(BatchSampler, PenaltiesOfOneRowDoNotLeakIntoTheNext) {
  BatchSampler batch(8);
  SamplingParams penalised;
  penalised.temperature = 0;
  penalised.frequency_penalty = 2.0f;
  penalised.repetition_penalty = 3.0f;
  SamplingParams plain;
  plain.temperature = 0;
  std::mt19937_64 r1(1), r2(2);
  const std::vector<int32_t> history = {3, 3, 3};
  std::vector<float> a = {0, 0, 0, 5, 0, 0, 0, 0}, b = {0, 0, 0, 5, 0, 0, 0, 0};
  std::vector<BatchSampler::Row> rows = {{&penalised, &r1, {{}, history}, a},
                                         {&plain, &r2, {history, {}}, b}};
  std::vector<int32_t> tokens(2);
  batch.sample(rows, {}, tokens);
  EXPECT_NE(tokens[0], 3);  // penalised away
  EXPECT_EQ(tokens[1], 3);  // the same token, unpenalised in the next row
  EXPECT_EQ(b[3], 5.0f);
}

TEST(BatchSampler, MinTokensBansEndTokensAndStopIdsUntilReached) {
  BatchSampler batch(6);
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  p.stop_token_ids = {4};
  std::mt19937_64 r(1);
  const std::vector<int32_t> one = {1}, two = {1, 1};
  std::vector<float> row = {0, 0, 9, 0, 8, 1};
  BatchSampler::Row early{&p, &r, {{}, one}, row};
  EXPECT_EQ(batch.sample_one(early, std::vector<int32_t>{2}), 5);
  std::vector<float> row2 = {0, 0, 9, 0, 8, 1};
  BatchSampler::Row later{&p, &r, {{}, two}, row2};
  EXPECT_EQ(batch.sample_one(later, std::vector<int32_t>{2}), 2);
}

TEST(Logprobs, NormalisedOverTheRawRowWithTopKInOrder) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  LogprobScratch scratch;
  const LogprobEntry e = compute_logprobs(logits, 4, 3, scratch);
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  EXPECT_NEAR(e.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(e.top.size(), 3u);
  EXPECT_EQ(e.top[0].token, 1);  // ties by id
  EXPECT_EQ(e.top[1].token, 2);
  EXPECT_EQ(e.top[2].token, 0);
  EXPECT_EQ(compute_logprobs(logits, 0, 50, scratch).top.size(), logits.size());
  EXPECT_TRUE(compute_logprobs(logits, 0, 0, scratch).top.empty());
}

}  // namespace
}  // namespace vesper::sample
