#include "sample/speculative_acceptance.h"

#include <algorithm>
#include <cmath>

#include "sample/sampler.h"

namespace vesper::sample {

Result<AcceptanceMethod> parse_acceptance_method(std::string_view name) {
  if (name == "rejection_sampler") return AcceptanceMethod::kRejectionSampler;
  if (name == "typical_acceptance_sampler") return AcceptanceMethod::kTypicalAcceptance;
  return make_error("unknown acceptance method \"" + std::string(name) +
                    "\" (use rejection_sampler or typical_acceptance_sampler)");
}

std::string_view acceptance_method_name(AcceptanceMethod method) {
  return method == AcceptanceMethod::kRejectionSampler ? "rejection_sampler"
                                                       : "typical_acceptance_sampler";
}

SpeculativeVerifier::SpeculativeVerifier(int32_t n_vocab)
    : scratch_(n_vocab), row_(n_vocab), p_(n_vocab, 0.0), residual_(n_vocab, 0.0) {}

void SpeculativeVerifier::target_distribution(const SamplingParams& params,
                                              const TokenHistory& history,
                                              std::span<const float> row,
                                              std::span<const int32_t> accepted,
                                              std::span<const int32_t> eog_ids) {
  std::copy(row.begin(), row.end(), row_.begin());
  output_.assign(history.output.begin(), history.output.end());
  output_.insert(output_.end(), accepted.begin(), accepted.end());
  const TokenHistory extended{history.prompt, output_, history.grammar_cursor};
  apply_logits_processors(params, extended, eog_ids, row_, scratch_);
  std::fill(p_.begin(), p_.end(), 0.0);
  const size_t keep = kept_distribution(params, row_, scratch_);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += scratch_.probs[i];
  for (size_t i = 0; i < keep; ++i) p_[scratch_.candidates[i]] = scratch_.probs[i] / total;
}

int32_t SpeculativeVerifier::draw_from(const std::vector<double>& weights, double total,
                                       std::mt19937_64& rng) const {
  std::uniform_real_distribution<double> uniform(0.0, total);
  const double r = uniform(rng);
  double acc = 0;
  int32_t last = 0;
  for (size_t t = 0; t < weights.size(); ++t) {
    if (weights[t] <= 0) continue;
    acc += weights[t];
    last = static_cast<int32_t>(t);
    if (r < acc) return last;
  }
  return last;
}

double SpeculativeVerifier::typical_threshold(const AcceptanceConfig& config) const {
  double entropy = 0;
  for (double p : p_)
    if (p > 0) entropy -= p * std::log(p);
  return std::min<double>(config.posterior_threshold, config.posterior_alpha * std::exp(-entropy));
}

TreeVerification SpeculativeVerifier::verify_tree(const SamplingParams& params,
                                                  const AcceptanceConfig& config,
                                                  std::mt19937_64& rng, const TokenHistory& history,
                                                  std::span<const std::span<const float>> rows,
                                                  std::span<const int32_t> proposals,
                                                  std::span<const int32_t> parents,
                                                  std::span<const int32_t> eog_ids) {
  VESPER_CHECK(rows.size() == proposals.size() + 1 && parents.size() == proposals.size(),
               "%zu rows and %zu parents for %zu proposals", rows.size(), parents.size(),
               proposals.size());
  TreeVerification v;
  kept_.clear();
  int32_t node = -1;  // the last kept node (-1: the root)
  for (;;) {
    target_distribution(params, history, rows[static_cast<size_t>(node + 1)], kept_, eog_ids);
    int32_t kept_child = -1;
    for (size_t c = 0; c < proposals.size() && kept_child < 0; ++c) {
      if (parents[c] != node) continue;
      const int32_t x = proposals[c];
      if (params.greedy()) {
        if (x == scratch_.candidates[0]) kept_child = static_cast<int32_t>(c);
      } else if (config.method == AcceptanceMethod::kTypicalAcceptance) {
        if (p_[x] > typical_threshold(config)) kept_child = static_cast<int32_t>(c);
      } else {
        // p_ is p' here: the children rejected so far were removed from it.
        if (p_[x] > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p_[x]) {
          kept_child = static_cast<int32_t>(c);
        } else if (p_[x] > 0) {
          const double rest = 1.0 - p_[x];
          p_[x] = 0;
          if (rest > 0)
            for (double& p : p_) p /= rest;
        }
      }
    }
    if (kept_child < 0) {
      v.next_token = params.greedy() ? scratch_.candidates[0] : draw_from(p_, 1.0, rng);
      return v;
    }
    v.path.push_back(kept_child);
    kept_.push_back(proposals[kept_child]);
    node = kept_child;
  }
}

Verification SpeculativeVerifier::verify(const SamplingParams& params,
                                         const AcceptanceConfig& config, std::mt19937_64& rng,
                                         const TokenHistory& history,
                                         std::span<const std::span<const float>> rows,
                                         std::span<const int32_t> proposals,
                                         std::span<const std::span<const float>> draft_probs,
                                         std::span<const int32_t> eog_ids) {
  VESPER_CHECK(rows.size() == proposals.size() + 1, "%zu rows for %zu proposals", rows.size(),
               proposals.size());
  Verification v;
  for (size_t i = 0; i <= proposals.size(); ++i) {
    target_distribution(params, history, rows[i], proposals.subspan(0, i), eog_ids);
    if (i == proposals.size()) {
      // Every proposal kept: a bonus token from the last row.
      v.next_token = params.greedy() ? scratch_.candidates[0] : draw_from(p_, 1.0, rng);
      return v;
    }
    const int32_t x = proposals[i];
    bool keep = false;
    if (params.greedy()) {
      keep = x == scratch_.candidates[0];
    } else if (config.method == AcceptanceMethod::kTypicalAcceptance) {
      keep = p_[x] > typical_threshold(config);
    } else {
      const double q = draft_probs.empty() ? 1.0 : static_cast<double>(draft_probs[i][x]);
      const double ratio = q > 0 ? p_[x] / q : 1.0;
      keep = ratio >= 1.0 || std::uniform_real_distribution<double>(0.0, 1.0)(rng) < ratio;
    }
    if (keep) {
      ++v.num_accepted;
      continue;
    }
    // The first rejection: the token after the kept prefix comes from the target.
    if (params.greedy()) {
      v.next_token = scratch_.candidates[0];
    } else if (config.method == AcceptanceMethod::kTypicalAcceptance) {
      v.next_token = draw_from(p_, 1.0, rng);
    } else {
      double total = 0;
      for (size_t t = 0; t < p_.size(); ++t) {
        const double q = draft_probs.empty() ? (static_cast<int32_t>(t) == x ? 1.0 : 0.0)
                                             : static_cast<double>(draft_probs[i][t]);
        residual_[t] = std::max(0.0, p_[t] - q);
        total += residual_[t];
      }
      // p <= q everywhere only when p == q, where nothing is ever rejected; guard all the same.
      v.next_token = total > 0 ? draw_from(residual_, total, rng) : draw_from(p_, 1.0, rng);
    }
    return v;
  }
  return v;
}

}  // namespace vesper::sample
