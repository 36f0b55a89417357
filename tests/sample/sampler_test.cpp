// Sampler: greedy ties, seeded determinism, each filter's effect, penalties, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "sample/sampler.h"

namespace vesper::sample {
namespace {

std::vector<float> logits_of(std::initializer_list<float> v) {
  return std::vector<float>(v);
}

int32_t draw(Sampler& s, std::vector<float> logits, std::vector<int32_t> prompt = {},
             std::vector<int32_t> output = {}) {
  return s.sample(logits, prompt, output);
}

TEST(Sampler, GreedyTakesFirstMaximum) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(draw(s, logits_of({1, 5, 5, 2})), 1);
  EXPECT_EQ(draw(s, logits_of({-3, -1, -2})), 1);
  EXPECT_EQ(argmax(logits_of({7})), 0);
}

// argmax against the plain first-maximum scan (`>` keeps the earlier index) on vocabulary-sized
// and odd-sized inputs, with ties across vector lanes, signed zeros, infinities and NaNs.
TEST(Sampler, ArgmaxIsTheFirstMaximumOfAPlainScan) {
  const auto scan = [](const std::vector<float>& v) {
    int32_t best = 0;
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i] > v[best]) best = static_cast<int32_t>(i);
    return best;
  };
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-3, 3);
  for (size_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32000, 32003}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> v(n);
      for (float& x : v) x = static_cast<float>(small(rng));  // many ties
      if (trial % 4 == 1) v[rng() % n] = NAN;
      if (trial % 4 == 2) v[0] = NAN;
      if (trial % 5 == 3) v[rng() % n] = INFINITY;
      if (trial % 7 == 4) std::fill(v.begin(), v.end(), trial % 2 ? -0.0f : 0.0f), v[n - 1] = 0.0f;
      if (trial % 6 == 5) v[n - 1] = 100.0f;  // the maximum in the tail past the last 8 lanes
      EXPECT_EQ(argmax(v), scan(v)) << "n " << n << " trial " << trial;
    }
  }
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int32_t> ra, rb;
  for (int i = 0; i < 200; ++i) {
    ra.push_back(draw(a, logits_of({0.1f, 0.2f, 0.3f, 0.0f, -0.5f})));
    rb.push_back(draw(b, logits_of({0.1f, 0.2f, 0.3f, 0.0f, -0.5f})));
  }
  EXPECT_EQ(ra, rb);
  p.seed = 99;
  Sampler c(p);
  std::vector<int32_t> rc;
  for (int i = 0; i < 200; ++i) rc.push_back(draw(c, logits_of({0.1f, 0.2f, 0.3f, 0.0f, -0.5f})));
  EXPECT_NE(ra, rc);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p);
  const std::vector<float> l = {0.0f, 1.0f, 2.0f};
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[draw(s, l)];
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(2.0);
  for (int t = 0; t < 3; ++t) {
    const double expected = std::exp(static_cast<double>(l[t])) / z;
    EXPECT_NEAR(counts[t] / static_cast<double>(n), expected, 0.015) << "token " << t << " seed 7";
  }
}

TEST(Sampler, TemperatureSharpens) {
  SamplingParams p;
  p.temperature = 0.05f;
  p.seed = 3;
  Sampler s(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(draw(s, logits_of({0.0f, 1.0f, 0.5f})), 1);
}

TEST(Sampler, TopKKeepsOnlyKBest) {
  SamplingParams p;
  p.top_k = 2;
  p.seed = 11;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) {
    int32_t t = draw(s, logits_of({1.0f, 3.0f, 0.5f, 2.9f}));
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
  SamplingParams p;
  p.top_p = 0.5f;
  p.seed = 5;
  Sampler s(p);
  // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top-p 0.5 keeps only the first.
  for (int i = 0; i < 300; ++i) EXPECT_EQ(draw(s, logits_of({3.0f, 2.0f, 1.0f, 0.0f})), 0);
  p.top_p = 0.8f;
  Sampler s2(p);
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[draw(s2, logits_of({3.0f, 2.0f, 1.0f, 0.0f}))];
  EXPECT_GT(counts[1], 0);
  EXPECT_EQ(counts[2] + counts[3], 0);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.min_p = 0.3f;
  p.seed = 5;
  Sampler s(p);
  // p(1)/p(0) = e^-1 ~ 0.37 >= 0.3 kept; p(2)/p(0) = e^-2 ~ 0.14 dropped.
  std::map<int32_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[draw(s, logits_of({3.0f, 2.0f, 1.0f}))];
  EXPECT_GT(counts[1], 0);
  EXPECT_EQ(counts[2], 0);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<float> l = {3.0f, 2.0f, -1.0f};
  std::vector<int32_t> prompt = {0}, output = {2};
  s.sample(l, prompt, output);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[1], 2.0f);
  EXPECT_FLOAT_EQ(l[2], -2.0f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<float> l = {3.0f, 3.0f, 3.0f};
  std::vector<int32_t> prompt = {2, 2}, output = {0, 0, 1};
  EXPECT_EQ(s.sample(l, prompt, output), 2);
  EXPECT_FLOAT_EQ(l[0], 3.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(l[1], 3.0f - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(l[2], 3.0f);
}

TEST(SamplingParams, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.validate().ok());
  p.temperature = -1;
  EXPECT_NE(p.validate().error().message.find("temperature"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_NE(p.validate().error().message.find("top_p"), std::string::npos);
  p = {};
  p.top_k = -3;
  EXPECT_NE(p.validate().error().message.find("top_k"), std::string::npos);
  p = {};
  p.min_p = 2;
  EXPECT_NE(p.validate().error().message.find("min_p"), std::string::npos);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_NE(p.validate().error().message.find("repetition_penalty"), std::string::npos);
  p = {};
  p.presence_penalty = 3;
  EXPECT_NE(p.validate().error().message.find("presence_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = -3;
  EXPECT_NE(p.validate().error().message.find("frequency_penalty"), std::string::npos);
}

}  // namespace
}  // namespace vesper::sample
