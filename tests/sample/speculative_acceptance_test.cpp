// The acceptance rules of speculative decoding against their promise: with rejection sampling,
// the tokens that come out follow the target's distribution p exactly, whatever the proposer's q
// (one-hot, as n-gram proposals are, or any other); greedy keeps proposals while they equal the
// argmax. Chi-square goodness of fit over many draws, with fixed seeds so the test cannot flake.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "sample/sampler.h"
#include "sample/speculative_acceptance.h"

namespace vesper::sample {
namespace {

constexpr int32_t kSmallVocab = 6;
// Chi-square critical value for `df` degrees of freedom at significance 0.001 (Wilson-Hilferty).
double chi2_critical(int df) {
  const double z = 3.0902;  // the standard normal's 0.999 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& x : p) x /= total;
  return p;
}

// The first `positions` emitted tokens over `trials` verifications of k proposals drawn from q;
// each emitted position's counts must fit p (every row is the same, so each position's marginal is
// p).
void check_fits_p(const std::vector<float>& logits, const std::vector<float>* q, int64_t k,
                  uint64_t seed) {
  SamplingParams params;
  params.temperature = 0.8f;
  const std::vector<double> p = softmax(logits, params.temperature);
  SpeculativeVerifier verifier(kSmallVocab);
  std::mt19937_64 rng(seed), proposer(seed + 1);
  std::discrete_distribution<int32_t> draft(q ? q->begin() : logits.begin(),
                                            q ? q->end() : logits.end());
  const std::vector<std::span<const float>> rows(static_cast<size_t>(k + 1), logits);
  std::vector<std::span<const float>> qs;
  if (q) qs.assign(static_cast<size_t>(k), *q);
  const std::vector<int32_t> empty;
  constexpr int kTrials = 30000;
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(k + 1),
                                           std::vector<int64_t>(kSmallVocab, 0));
  int64_t accepted = 0;
  for (int t = 0; t < kTrials; ++t) {
    std::vector<int32_t> proposals(static_cast<size_t>(k));
    // One-hot q: always the same proposal (as prompt lookup would propose), else draws from q.
    for (auto& x : proposals) x = q ? draft(proposer) : 2;
    const Verification v = verifier.verify(params, AcceptanceConfig{}, rng,
                                           TokenHistory{empty, empty}, rows, proposals, qs, empty);
    accepted += v.num_accepted;
    for (int64_t j = 0; j <= v.num_accepted; ++j)
      ++counts[j][j < v.num_accepted ? proposals[j] : v.next_token];
  }
  EXPECT_GT(accepted, 0);
  // Position 0 is always emitted: its counts fit p. (Later positions are emitted only after
  // acceptances, which select on the proposals, so only position 0's marginal is p.)
  double chi2 = 0;
  for (int32_t t = 0; t < kSmallVocab; ++t) {
    const double expected = p[t] * kTrials;
    chi2 += (counts[0][t] - expected) * (counts[0][t] - expected) / expected;
  }
  EXPECT_LT(chi2, chi2_critical(kSmallVocab - 1)) << (q ? "draft q" : "one-hot q") << ", k " << k;
}

TEST(SpeculativeAcceptance, RejectionSamplingFollowsTheTargetWithOneHotProposals) {
  check_fits_p({1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f}, nullptr, 1, 11);
  check_fits_p({1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f}, nullptr, 3, 12);
}

// A tree of one-hot candidates (Medusa's): siblings tried in turn, each rejection taking the
// candidate out of p. The first token must follow p, and so must the second given the first (all
// rows are the same p here).
TEST(SpeculativeAcceptance, TreeRejectionSamplingFollowsTheTarget) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f};
  SamplingParams params;
  params.temperature = 0.8f;
  const std::vector<double> p = softmax(logits, params.temperature);
  // Root children 3, 5, 2; under 3: 0 and 1; under 0: 4.
  const std::vector<int32_t> tokens = {3, 5, 2, 0, 1, 4};
  const std::vector<int32_t> parents = {-1, -1, -1, 0, 0, 3};
  const std::vector<std::span<const float>> rows(tokens.size() + 1, logits);
  SpeculativeVerifier verifier(kSmallVocab);
  std::mt19937_64 rng(21);
  const std::vector<int32_t> empty;
  constexpr int kTrials = 40000;
  std::vector<int64_t> first(kSmallVocab, 0), second_after_3(kSmallVocab, 0);
  int64_t deep = 0;
  for (int t = 0; t < kTrials; ++t) {
    const TreeVerification v = verifier.verify_tree(
        params, AcceptanceConfig{}, rng, TokenHistory{empty, empty}, rows, tokens, parents, empty);
    std::vector<int32_t> out;
    for (size_t i = 0; i < v.path.size(); ++i) {
      ASSERT_EQ(parents[v.path[i]], i == 0 ? -1 : v.path[i - 1]);
      out.push_back(tokens[v.path[i]]);
    }
    out.push_back(v.next_token);
    ++first[out[0]];
    if (out[0] == 3) ++second_after_3[out[1]];
    if (v.path.size() >= 3) ++deep;
  }
  EXPECT_GT(deep, 0) << "the third level was never reached";
  auto chi2 = [&](const std::vector<int64_t>& counts) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    double x = 0;
    for (int32_t t = 0; t < kSmallVocab; ++t) {
      const double expected = p[t] * static_cast<double>(n);
      x += (counts[t] - expected) * (counts[t] - expected) / expected;
    }
    return x;
  };
  EXPECT_LT(chi2(first), chi2_critical(kSmallVocab - 1));
  EXPECT_LT(chi2(second_after_3), chi2_critical(kSmallVocab - 1));
}

TEST(SpeculativeAcceptance, GreedyTreeFollowsTheArgmaxDownTheTree) {
  // Row 0 (the root's) argmax is 3; node 0 (token 3)'s row argmax is 1; node 3 (token 1) is kept;
  // its row's argmax 5 has no child there: the next token.
  std::vector<std::vector<float>> logits(5, std::vector<float>(kSmallVocab, 0.0f));
  logits[0][3] = 5;
  logits[1][1] = 5;  // node 0's row
  logits[4][5] = 5;  // node 3's row
  const std::vector<int32_t> tokens = {2, 3, 0, 1};
  const std::vector<int32_t> parents = {-1, -1, 1, 1};
  std::vector<std::span<const float>> rows;
  // rows[1 + j] is node j's: node 1 (token 3) is the one kept first.
  rows = {logits[0], logits[2], logits[1], logits[3], logits[4]};
  SamplingParams greedy;
  greedy.temperature = 0;
  SpeculativeVerifier verifier(kSmallVocab);
  std::mt19937_64 rng(1);
  const std::vector<int32_t> empty;
  const TreeVerification v = verifier.verify_tree(
      greedy, AcceptanceConfig{}, rng, TokenHistory{empty, empty}, rows, tokens, parents, empty);
  EXPECT_EQ(v.path, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(v.next_token, 5);
}

TEST(SpeculativeAcceptance, RejectionSamplingFollowsTheTargetWithADraftDistribution) {
  const std::vector<float> q = {0.05f, 0.4f, 0.3f, 0.05f, 0.15f, 0.05f};
  check_fits_p({1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f}, &q, 1, 21);
  check_fits_p({0.0f, 3.0f, 0.1f, 0.2f, -1.0f, 0.5f}, &q, 2, 22);
}

TEST(SpeculativeAcceptance, GreedyKeepsProposalsWhileTheyAreTheArgmax) {
  SamplingParams greedy;
  greedy.temperature = 0;
  SpeculativeVerifier verifier(kSmallVocab);
  std::mt19937_64 rng(1);
  const std::vector<float> a = {0, 5, 1, 0, 0, 0}, b = {0, 0, 0, 7, 0, 0}, c = {4, 0, 0, 0, 0, 0};
  const std::vector<std::span<const float>> rows = {a, b, c};
  const std::vector<int32_t> empty;
  for (auto method : {AcceptanceMethod::kRejectionSampler, AcceptanceMethod::kTypicalAcceptance}) {
    AcceptanceConfig config;
    config.method = method;
    Verification v = verifier.verify(greedy, config, rng, {empty, empty}, rows,
                                     std::vector<int32_t>{1, 3}, {}, empty);
    EXPECT_EQ(v.num_accepted, 2);
    EXPECT_EQ(v.next_token, 0);  // the bonus: row 2's argmax
    v = verifier.verify(greedy, config, rng, {empty, empty}, rows, std::vector<int32_t>{1, 4}, {},
                        empty);
    EXPECT_EQ(v.num_accepted, 1);
    EXPECT_EQ(v.next_token, 3);  // row 1's argmax replaces the miss
    v = verifier.verify(greedy, config, rng, {empty, empty}, rows, std::vector<int32_t>{2, 3}, {},
                        empty);
    EXPECT_EQ(v.num_accepted, 0);
    EXPECT_EQ(v.next_token, 1);
  }
}

TEST(SpeculativeAcceptance, ProcessorsSeeTheProposalsKeptBeforeThem) {
  // A strong frequency penalty: with proposal 1 kept, row 1 (which would pick 1 again) now picks 2.
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 2.0f;
  SpeculativeVerifier verifier(kSmallVocab);
  std::mt19937_64 rng(1);
  const std::vector<float> row0 = {0, 5, 0, 0, 0, 0}, row1 = {0, 3, 2, 0, 0, 0};
  const std::vector<std::span<const float>> rows = {row0, row1};
  const std::vector<int32_t> empty;
  const Verification v = verifier.verify(p, AcceptanceConfig{}, rng, {empty, empty}, rows,
                                         std::vector<int32_t>{1}, {}, empty);
  EXPECT_EQ(v.num_accepted, 1);
  EXPECT_EQ(v.next_token, 2);
}

TEST(SpeculativeAcceptance, MethodNames) {
  EXPECT_EQ(*parse_acceptance_method("rejection_sampler"), AcceptanceMethod::kRejectionSampler);
  EXPECT_EQ(*parse_acceptance_method("typical_acceptance_sampler"),
            AcceptanceMethod::kTypicalAcceptance);
  EXPECT_FALSE(parse_acceptance_method("greedy").ok());
}

}  // namespace
}  // namespace vesper::sample
