#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace vesper::sample {

int32_t argmax(std::span<const float> logits) {
  // The first index of the largest value (NaNs never win; a NaN at index 0 keeps index 0, as a
  // scan with `>` does). Two passes: the maximum over 8 independent lanes, which the compiler
  // turns into vector max instructions, then the first index holding it. Greedy decoding runs this
  // over the whole vocabulary for every sequence and step, and a one-pass scan with its
  // index-carrying dependency was several percent of a batched decode step.
  const size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  float lanes[8];
  std::fill(lanes, lanes + 8, logits[0]);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = logits[i + l] > lanes[l] ? logits[i + l] : lanes[l];
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
  for (; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t j = 0; j < n; ++j)
    if (logits[j] == best) return static_cast<int32_t>(j);
  return 0;  // unreachable: best is one of the logits
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed.has_value() ? *params.seed : std::random_device{}()) {}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> prompt,
                              std::span<const int32_t> output) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  const bool additive = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;
  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  counts_.assign(n_vocab, 0);
  for (int32_t t : output)
    if (t >= 0 && t < n_vocab) ++counts_[t];
  if (repetition) {
    // vLLM: tokens seen in the prompt or the output are divided (positive logits) or
    // multiplied (negative logits) by the penalty.
    std::vector<bool> seen(n_vocab, false);
    for (int32_t t : prompt)
      if (t >= 0 && t < n_vocab) seen[t] = true;
    for (int32_t t = 0; t < n_vocab; ++t) {
      if (!seen[t] && counts_[t] == 0) continue;
      logits[t] = logits[t] > 0 ? logits[t] / params_.repetition_penalty
                                : logits[t] * params_.repetition_penalty;
    }
  }
  if (additive) {
    for (int32_t t = 0; t < n_vocab; ++t) {
      if (counts_[t] == 0) continue;
      logits[t] -=
          params_.frequency_penalty * static_cast<float>(counts_[t]) + params_.presence_penalty;
    }
  }
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt,
                        std::span<const int32_t> output) {
  apply_penalties(logits, prompt, output);
  if (params_.greedy()) return argmax(logits);

  const int32_t n_vocab = static_cast<int32_t>(logits.size());
  candidates_.resize(n_vocab);
  std::iota(candidates_.begin(), candidates_.end(), 0);
  // Sort candidates by logit, descending; ties by id, so the order is deterministic.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Softmax over the kept candidates at the temperature (double sums for stability).
  probs_.resize(keep);
  const double max_logit = logits[candidates_[0]];
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    const double p = std::exp((logits[candidates_[i]] - max_logit) / params_.temperature);
    probs_[i] = static_cast<float>(p);
    total += p;
  }
  // top-p: the smallest prefix whose mass reaches top_p (at least one token).
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      mass += probs_[i] / total;
      if (mass >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  // min-p: drop tokens whose probability is below min_p times the top probability.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * probs_[0];
    size_t cut = 1;
    while (cut < keep && probs_[cut] >= threshold) ++cut;
    keep = cut;
  }
  double kept_total = 0.0;
  for (size_t i = 0; i < keep; ++i) kept_total += probs_[i];
  std::uniform_real_distribution<double> uniform(0.0, kept_total);
  const double r = uniform(rng_);
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (r < acc) return candidates_[i];
  }
  return candidates_[keep - 1];
}

}  // namespace vesper::sample
