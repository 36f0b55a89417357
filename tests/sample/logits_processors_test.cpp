// The token-level logits processors: allowed_token_ids, bad_words, logit_bias, and their order
// with min_tokens and the penalties (vLLM's); a row whose every token is masked still draws.
#include "sample/logits_processors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "sample/sampler.h"

namespace vesper::sample {
namespace {

std::vector<float> ramp(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>(i);
  return v;
}

TEST(LogitsProcessors, AllowedTokenIdsMaskEveryOtherTokenAndLeaveTheScratchClean) {
  SamplingScratch scratch(10);
  SamplingParams p;
  p.allowed_token_ids = {2, 5, 5, 7};
  std::vector<float> row = ramp(10);
  apply_allowed_token_ids(p, row, scratch);
  for (int t = 0; t < 10; ++t) {
    if (t == 2 || t == 5 || t == 7)
      EXPECT_FLOAT_EQ(row[t], 0.1f * static_cast<float>(t)) << t;
    else
      EXPECT_EQ(row[t], -INFINITY) << t;
    EXPECT_EQ(scratch.seen[t], 0) << t;
  }
}

TEST(LogitsProcessors, BadWordsBanTheLastTokenOnlyAfterTheRestOfTheWord) {
  SamplingParams p;
  p.bad_words_token_ids = {{4}, {1, 2, 3}, {6, 3}};
  const std::vector<int32_t> after_1_2 = {9, 1, 2}, after_2 = {0, 2}, after_6 = {6};
  std::vector<float> row = ramp(10);
  apply_bad_words(p, after_1_2, row);
  EXPECT_EQ(row[4], -INFINITY);  // a one-token word: always
  EXPECT_EQ(row[3], -INFINITY);  // 1 2 was output: 3 would complete "1 2 3"
  row = ramp(10);
  apply_bad_words(p, after_2, row);
  EXPECT_EQ(row[4], -INFINITY);
  EXPECT_FLOAT_EQ(row[3], 0.3f);  // only 2, not 1 2: 3 stays
  row = ramp(10);
  apply_bad_words(p, after_6, row);
  EXPECT_EQ(row[3], -INFINITY);
  row = ramp(10);
  apply_bad_words(p, {}, row);  // too short an output for the longer words
  EXPECT_FLOAT_EQ(row[3], 0.3f);
}

TEST(LogitsProcessors, LogitBiasIsAddedBeforePenaltiesAndCannotUnmaskAToken) {
  SamplingScratch scratch(6);
  SamplingParams p;
  p.logit_bias = {{1, 2.0f}, {3, 100.0f}, {5, -100.0f}};
  p.allowed_token_ids = {0, 1, 2, 5};
  p.repetition_penalty = 2.0f;
  const std::vector<int32_t> prompt = {1}, output;
  std::vector<float> row = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  apply_logits_processors(p, TokenHistory{prompt, output}, {}, row, scratch);
  EXPECT_FLOAT_EQ(row[0], 1.0f);
  EXPECT_FLOAT_EQ(row[1], 1.5f);  // (1 + 2) / 2: the penalty sees the biased logit
  EXPECT_EQ(row[3], -INFINITY);   // not allowed: +100 does not bring it back
  EXPECT_FLOAT_EQ(row[5], -99.0f);
  EXPECT_EQ(row[4], -INFINITY);
}

TEST(LogitsProcessors, ARowWithEveryTokenMaskedStillDrawsAnAllowedCandidate) {
  // allowed_token_ids = {2} but min_tokens bans it (it is a stop token): nothing is left.
  SamplingParams p;
  p.allowed_token_ids = {2};
  p.stop_token_ids = {2};
  p.min_tokens = 3;
  p.max_tokens = 8;
  p.temperature = 0.7f;
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) {
    std::vector<float> row = ramp(12);
    const int32_t t = s.sample(row, {}, {});
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 12);
  }
}

TEST(LogitsProcessors, ValidationNamesTheField) {
  SamplingParams p;
  p.logit_bias = {{3, 101.0f}};
  EXPECT_EQ(p.validate().error().message, "logit_bias[3] must be in [-100, 100], got 101");
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_EQ(p.validate().error().message, "logit_bias token id must be >= 0, got -1");
  p.logit_bias.clear();
  p.allowed_token_ids = {-4};
  EXPECT_EQ(p.validate().error().message, "allowed_token_ids must be >= 0, got -4");
  p.allowed_token_ids.clear();
  p.bad_words = {""};
  EXPECT_EQ(p.validate().error().message, "bad_words must not be empty strings");
}

}  // namespace
}  // namespace vesper::sample
