#include "spec/speculation_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace vesper::spec {
namespace {

// Before any verification: proposals are kept half the time, with the weight of 8 proposals.
constexpr double kPriorReached = 8.0, kPriorRate = 0.5;
// Each verification's counts are added to the old ones times this: the estimate covers about the
// last 200 verifications.
constexpr double kDecay = 0.995;

}  // namespace

void PassCost::add(int64_t rows, double seconds) {
  auto it = std::lower_bound(points_.begin(), points_.end(), rows,
                             [](const auto& p, int64_t r) { return p.first < r; });
  if (it != points_.end() && it->first == rows)
    it->second = seconds;
  else
    points_.insert(it, {rows, seconds});
  refresh();
}

void PassCost::refresh() {
  floor_.resize(points_.size());
  double least = 1e30;
  for (size_t i = points_.size(); i-- > 0;) floor_[i] = least = std::min(least, points_[i].second);
}

std::string PassCost::describe() const {
  std::string out;
  char buf[48];
  for (const auto& [rows, seconds] : points_) {
    std::snprintf(buf, sizeof buf, "%s%lld: %.2f", out.empty() ? "" : ", ",
                  static_cast<long long>(rows), seconds * 1e3);
    out += buf;
  }
  return out;
}

double PassCost::at(double rows) const {
  if (points_.empty()) return 0.0;
  if (points_.size() == 1)
    return floor_[0] * std::max(1.0, rows / static_cast<double>(points_[0].first));
  if (rows <= static_cast<double>(points_.front().first)) return floor_.front();
  size_t i = 1;
  while (i + 1 < points_.size() && static_cast<double>(points_[i].first) < rows) ++i;
  const double r0 = static_cast<double>(points_[i - 1].first), t0 = floor_[i - 1];
  const double r1 = static_cast<double>(points_[i].first), t1 = floor_[i];
  return std::max(t0, t0 + (t1 - t0) / (r1 - r0) * (rows - r0));
}

SpeculationPolicy::SpeculationPolicy(int64_t k_max, ProposerCost proposer_cost)
    : k_max_(k_max), proposer_cost_kind_(proposer_cost) {}

void SpeculationPolicy::record(int64_t proposed, int64_t accepted) {
  // Positions 1..accepted were reached and kept; position accepted + 1 (if proposed) was reached
  // and rejected.
  reached_ = reached_ * kDecay + static_cast<double>(std::min(proposed, accepted + 1));
  kept_ = kept_ * kDecay + static_cast<double>(accepted);
}

double SpeculationPolicy::acceptance_rate() const {
  const double a = (kept_ + kPriorRate * kPriorReached) / (reached_ + kPriorReached);
  return std::clamp(a, 0.0, 0.999);
}

double SpeculationPolicy::expected_tokens(int64_t k, double rate) {
  double e = 1, term = 1;
  for (int64_t j = 1; j <= k; ++j) e += term *= rate;
  return e;
}

int64_t SpeculationPolicy::best_k(int64_t seqs, int64_t other_rows, double rate) const {
  if (seqs <= 0 || target_.empty()) return 0;
  const double b = static_cast<double>(seqs), p = static_cast<double>(other_rows);
  // The decoding sequences are charged what their rows add to the step: the other rows (prompt
  // chunks) are work the step does anyway. Charging the whole step instead made verification rows
  // look nearly free beside a large prefill chunk, and proposals were made where the step is
  // compute-bound and every row costs its share (measured: 0.89x of speculation off under a load
  // of 64 streams).
  const double base = p > 0 ? target_.at(p) : 0.0;
  auto cost = [&](double rows) { return std::max(target_.at(p + rows) - base, 1e-9); };
  int64_t best = 0;
  double best_rate = b / cost(b);
  for (int64_t k = 1; k <= k_max_; ++k) {
    double proposer = 0;
    if (proposer_cost_kind_ == ProposerCost::kPassPerToken)
      proposer = static_cast<double>(k) * proposer_.at(b);
    if (proposer_cost_kind_ == ProposerCost::kOnePass) proposer = proposer_.at(b);
    const double tokens_per_second =
        b * expected_tokens(k, rate) / (cost(b * static_cast<double>(1 + k)) + proposer);
    if (tokens_per_second > best_rate) {
      best_rate = tokens_per_second;
      best = k;
    }
  }
  return best;
}

int64_t SpeculationPolicy::choose(int64_t seqs, int64_t other_rows) {
  const int64_t k = best_k(seqs, other_rows);
  if (k > 0) {
    steps_without_ = 0;
    probe_every_ = kProbeEvery;
    return k;
  }
  if (seqs == 0 || ++steps_without_ < probe_every_) return 0;
  // Nothing to learn where even perfect proposals would not pay.
  if (best_k(seqs, other_rows, 0.99) == 0) return 0;
  steps_without_ = 0;
  probe_every_ = std::min(2 * probe_every_, kMaxProbeEvery);
  return 1;
}

}  // namespace vesper::spec
