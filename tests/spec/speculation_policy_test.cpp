// SpeculationPolicy (--num-speculative-tokens auto) on cost tables shaped like the two machines
// the issue describes: the widened stories260K (a 1-row step 16.8 ms, 5 rows 22.5 ms, 8 rows
// 29.8 ms, 16 rows 49.5 ms: memory-bound up to about 6 rows) and stories260K itself (5 rows cost
// about 4.5 times 1 row: compute-bound). No timing here: the tables are given.
#include <gtest/gtest.h>

#include "spec/speculation_policy.h"

namespace vesper::spec {
namespace {

void widened(PassCost& t) {
  t.add(1, 16.8e-3);
  t.add(5, 22.5e-3);
  t.add(8, 29.8e-3);
  t.add(16, 49.5e-3);
  t.add(64, 170e-3);
}

void compute_bound(PassCost& t) {
  for (int r = 1; r <= 64; r *= 2) t.add(r, 0.9e-4 * r + 0.1e-4);
}

// Acceptance as a distilled draft gets it (ADAPTERS.md: about 0.85).
void accept(SpeculationPolicy& p, double rate, int verifications = 400, int k = 4) {
  for (int i = 0; i < verifications; ++i) {
    int kept = 0;
    // A deterministic pattern with the given rate: keep while the running fraction allows.
    while (kept < k && (i * 7919 + kept * 104729) % 1000 < rate * 1000) ++kept;
    p.record(k, kept);
  }
}

TEST(PassCost, InterpolatesAndNeverGetsCheaperWithMoreRows) {
  PassCost t;
  t.add(1, 10);
  t.add(4, 16);
  t.add(8, 8);                   // noise: 8 rows measured cheaper than 4
  EXPECT_DOUBLE_EQ(t.at(1), 8);  // read as the least from there on
  EXPECT_DOUBLE_EQ(t.at(8), 8);
  EXPECT_DOUBLE_EQ(t.at(16), 8);  // past the last point: no cheaper
  PassCost u;
  u.add(2, 2);
  u.add(4, 4);
  EXPECT_DOUBLE_EQ(u.at(3), 3);
  EXPECT_DOUBLE_EQ(u.at(8), 8);  // linear past the last two points
  EXPECT_DOUBLE_EQ(u.at(1), 2);
}

TEST(SpeculationPolicy, ExpectedTokensFollowTheGeometricModel) {
  EXPECT_DOUBLE_EQ(SpeculationPolicy::expected_tokens(0, 0.8), 1.0);
  EXPECT_DOUBLE_EQ(SpeculationPolicy::expected_tokens(2, 0.5), 1.75);
  SpeculationPolicy p(8, SpeculationPolicy::ProposerCost::kFree);
  accept(p, 0.9);
  EXPECT_GT(p.acceptance_rate(), 0.75);
  accept(p, 0.1, 2000);  // the workload changes: the estimate follows
  EXPECT_LT(p.acceptance_rate(), 0.3);
}

TEST(SpeculationPolicy, PicksSeveralTokensWhereAStepIsMemoryBound) {
  SpeculationPolicy p(8, SpeculationPolicy::ProposerCost::kPassPerToken);
  widened(p.target_cost());
  p.proposer_cost().add(1, 0.4e-3);  // the draft: 1 MB, in cache
  p.proposer_cost().add(8, 0.8e-3);
  accept(p, 0.85);
  EXPECT_GE(p.best_k(1, 0), 3);
  // Fewer tokens once acceptance is poor, none once it is hopeless.
  SpeculationPolicy poor(8, SpeculationPolicy::ProposerCost::kPassPerToken);
  widened(poor.target_cost());
  poor.proposer_cost().add(1, 0.4e-3);
  accept(poor, 0.02, 1000);
  EXPECT_EQ(poor.best_k(1, 0), 0);
}

TEST(SpeculationPolicy, PicksNoneWhereAStepIsComputeBoundOrTheBatchLarge) {
  SpeculationPolicy p(8, SpeculationPolicy::ProposerCost::kFree);
  compute_bound(p.target_cost());
  accept(p, 0.85);
  EXPECT_EQ(p.best_k(1, 0), 0);
  SpeculationPolicy wide(8, SpeculationPolicy::ProposerCost::kFree);
  widened(wide.target_cost());
  accept(wide, 0.85);
  EXPECT_GE(wide.best_k(1, 0), 3);
  EXPECT_EQ(wide.best_k(32, 0), 0);  // 32 sequences: already past the memory-bound rows
}

TEST(SpeculationPolicy, ChargesDecodingRowsWhatTheyAddBesideAPromptChunk) {
  // Beside 60 prompt rows a step of the widened model is compute-bound (past 16 rows each row
  // costs ~2.5 ms): 4 sequences' verification rows cost what they add, not a share of the chunk
  // that made the step long anyway.
  SpeculationPolicy wide(8, SpeculationPolicy::ProposerCost::kFree);
  widened(wide.target_cost());
  accept(wide, 0.6);
  EXPECT_GE(wide.best_k(1, 0), 1);
  EXPECT_EQ(wide.best_k(4, 60), 0);
}

TEST(SpeculationPolicy, ProbesRarelyWhereItPicksNoneAndNeverWhereNothingCouldPay) {
  SpeculationPolicy p(8, SpeculationPolicy::ProposerCost::kFree);
  // Free proposals and a pass of 9 rows costing 5 of 1 row: perfect proposals would pay, poor
  // ones do not.
  p.target_cost().add(1, 1.0);
  p.target_cost().add(9, 5.0);
  accept(p, 0.05, 2000);
  std::vector<int64_t> probes;
  for (int64_t step = 1; step <= 1000; ++step)
    if (p.choose(1, 0) > 0) probes.push_back(step);
  // Every 32 steps, then 64, 128, ...: the interval doubles while probes find nothing.
  EXPECT_EQ(probes, (std::vector<int64_t>{32, 96, 224, 480, 992}));

  SpeculationPolicy hopeless(8, SpeculationPolicy::ProposerCost::kPassPerToken);
  compute_bound(hopeless.target_cost());
  hopeless.proposer_cost().add(1, 0.5e-4);  // a draft costing half the target
  int64_t proposing = 0;
  for (int step = 0; step < 1000; ++step) proposing += hopeless.choose(1, 0) > 0;
  EXPECT_EQ(proposing, 0);
}

}  // namespace
}  // namespace vesper::spec
