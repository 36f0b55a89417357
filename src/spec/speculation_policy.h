// SpeculationPolicy: `--num-speculative-tokens auto`. Speculation pays only where a pass of the
// target over more rows costs little more than one over fewer (a memory-bound step); on a small,
// compute-bound model (stories260K), or once the batch is large, verifying proposals costs more
// than the tokens they save. The policy picks the proposal length k for each step (0: none) to
// maximise generated tokens per second, from three measurements:
//  - T(r): what a target pass of r rows costs (PassCost, measured at start over a range of row
//    counts and interpolated);
//  - the proposer's own cost: a draft model's pass of r rows (k of them per step) or Medusa heads'
//    one pass, measured the same way (n-gram lookup costs nothing);
//  - the acceptance rate a: of the proposals a step verified, how many were kept, counted per
//    position reached (the maximum-likelihood estimate under the standard model where each
//    proposal is kept with probability a once those before it were), with old steps' counts
//    decaying so that the estimate follows the workload. A sequence then gains
//    E(k) = 1 + a + ... + a^k tokens per step (Leviathan et al. 2023).
// With B sequences about to decode and P other rows in the step (prompt chunks), the chosen k
// maximises B E(k) / (T(P + B (1 + k)) - T(P) + proposer cost): the decoding sequences are
// charged what their rows add to a step that computes the P rows anyway. T is timed at start: the
// pass, plus what sampling or verifying each row costs (on a small model as much as the pass
// itself). Timing at start rather than from the running steps keeps one noisy step (a page fault, a
// neighbour on the machine) from steering every later choice: a row count never chosen would never
// be re-measured. A step that does not speculate teaches nothing about acceptance, so after
// kProbeEvery steps at k = 0 one step proposes a single token; while probes keep confirming k = 0
// the interval doubles (up to kMaxProbeEvery), so their cost fades. Where speculation could not pay
// even if every proposal were kept (a draft model that costs too much next to a small target),
// there are no probes at all.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vesper::spec {

// Seconds per pass as a function of rows: piecewise linear through the measured points, and
// linear past the last two. A pass over fewer rows never costs more than one over more, so a
// point is read as the least of it and the points past it (timing noise only ever adds).
class PassCost {
 public:
  // Sets the cost at `rows`.
  void add(int64_t rows, double seconds);
  double at(double rows) const;
  bool empty() const { return points_.empty(); }
  // "rows: ms" of each measured point, for the startup log.
  std::string describe() const;

 private:
  void refresh();
  std::vector<std::pair<int64_t, double>> points_;  // by rows
  std::vector<double> floor_;                       // each point's least cost from it on
};

class SpeculationPolicy {
 public:
  // How the proposer's cost grows with k: a draft model runs k passes over the B sequences;
  // Medusa heads run once, whatever k; n-gram lookup is free.
  enum class ProposerCost { kFree, kPassPerToken, kOnePass };

  SpeculationPolicy(int64_t k_max, ProposerCost proposer_cost);

  PassCost& target_cost() { return target_; }
  const PassCost& target_cost() const { return target_; }
  PassCost& proposer_cost() { return proposer_; }
  const PassCost& proposer_cost() const { return proposer_; }

  // A verification of `proposed` proposals kept the first `accepted` of them.
  void record(int64_t proposed, int64_t accepted);
  double acceptance_rate() const;
  double expected_tokens(int64_t k) const { return expected_tokens(k, acceptance_rate()); }
  static double expected_tokens(int64_t k, double rate);  // E(k)

  // The k for a step with `seqs` sequences about to decode and `other_rows` other rows; counts
  // the step (for probing). 0: no proposals this step.
  int64_t choose(int64_t seqs, int64_t other_rows);
  // The same without counting (what choose would answer now, ignoring probes), at the measured
  // acceptance rate or at `rate`.
  int64_t best_k(int64_t seqs, int64_t other_rows) const {
    return best_k(seqs, other_rows, acceptance_rate());
  }
  int64_t best_k(int64_t seqs, int64_t other_rows, double rate) const;

  static constexpr int64_t kProbeEvery = 32;
  static constexpr int64_t kMaxProbeEvery = 1024;

 private:
  int64_t k_max_;
  ProposerCost proposer_cost_kind_;
  PassCost target_, proposer_;
  // Decayed counts of proposals reached and kept; a prior of kPriorReached proposals kept at rate
  // kPriorRate.
  double reached_ = 0, kept_ = 0;
  int64_t steps_without_ = 0;
  int64_t probe_every_ = kProbeEvery;
};

}  // namespace vesper::spec
