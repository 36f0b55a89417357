#include "sample/logits_processors.h"

#include <cmath>

namespace vesper::sample {

SamplingScratch::SamplingScratch(int32_t n_vocab)
    : counts(n_vocab, 0), seen(n_vocab, 0), candidates(n_vocab), probs(n_vocab) {
  touched.reserve(n_vocab);
}

void apply_min_tokens(const SamplingParams& params, int64_t num_generated,
                      std::span<const int32_t> eog_ids, std::span<float> logits) {
  if (num_generated >= params.min_tokens) return;
  const auto n_vocab = static_cast<int32_t>(logits.size());
  for (int32_t id : eog_ids) logits[id] = -INFINITY;
  for (int32_t id : params.stop_token_ids)
    if (id >= 0 && id < n_vocab) logits[id] = -INFINITY;
}

void apply_penalties(const SamplingParams& params, const TokenHistory& history,
                     std::span<float> logits, SamplingScratch& scratch) {
  const bool repetition = params.repetition_penalty != 1.0f;
  const bool additive = params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f;
  if (!repetition && !additive) return;
  const auto n_vocab = static_cast<int32_t>(logits.size());
  auto mark = [&](int32_t t) {
    if (t < 0 || t >= n_vocab || scratch.seen[t]) return;
    scratch.seen[t] = 1;
    scratch.touched.push_back(t);
  };
  for (int32_t t : history.output) {
    if (t < 0 || t >= n_vocab) continue;
    ++scratch.counts[t];
    mark(t);
  }
  if (repetition)
    for (int32_t t : history.prompt) mark(t);
  // Each distinct token once, repetition first, then the additive penalties: vLLM's order.
  for (int32_t t : scratch.touched) {
    if (repetition)
      logits[t] = logits[t] > 0 ? logits[t] / params.repetition_penalty
                                : logits[t] * params.repetition_penalty;
    if (additive && scratch.counts[t] != 0)
      logits[t] -= params.frequency_penalty * static_cast<float>(scratch.counts[t]) +
                   params.presence_penalty;
  }
  for (int32_t t : scratch.touched) {
    scratch.seen[t] = 0;
    scratch.counts[t] = 0;
  }
  scratch.touched.clear();
}

}  // namespace vesper::sample
