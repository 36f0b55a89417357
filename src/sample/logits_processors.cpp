#include "sample/logits_processors.h"

#include <algorithm>
#include <cmath>

namespace vesper::sample {

SamplingScratch::SamplingScratch(int32_t n_vocab)
    : counts(n_vocab, 0), seen(n_vocab, 0), candidates(n_vocab), probs(n_vocab) {
  touched.reserve(n_vocab);
}

void apply_logits_processors(const SamplingParams& params, const TokenHistory& history,
                             std::span<const int32_t> eog_ids, std::span<float> logits,
                             SamplingScratch& scratch) {
  apply_grammar(params, history, logits);
  apply_allowed_token_ids(params, logits, scratch);
  apply_bad_words(params, history.output, logits);
  apply_min_tokens(params, static_cast<int64_t>(history.output.size()), eog_ids, logits);
  apply_logit_bias(params, logits);
  apply_penalties(params, history, logits, scratch);
}

void apply_grammar(const SamplingParams& params, const TokenHistory& history,
                   std::span<float> logits) {
  if (!params.grammar) return;
  const grammar::StateId state =
      history.grammar_cursor != nullptr
          ? params.grammar->state_after(*history.grammar_cursor, history.output)
          : params.grammar->state_after(history.output);
  params.grammar->apply(state, logits);
}

void apply_allowed_token_ids(const SamplingParams& params, std::span<float> logits,
                             SamplingScratch& scratch) {
  if (params.allowed_token_ids.empty()) return;
  const auto n_vocab = static_cast<int32_t>(logits.size());
  for (int32_t t : params.allowed_token_ids)
    if (t >= 0 && t < n_vocab) scratch.seen[t] = 1;
  for (int32_t t = 0; t < n_vocab; ++t)
    if (!scratch.seen[t]) logits[t] = -INFINITY;
  for (int32_t t : params.allowed_token_ids)
    if (t >= 0 && t < n_vocab) scratch.seen[t] = 0;
}

void apply_bad_words(const SamplingParams& params, std::span<const int32_t> output,
                     std::span<float> logits) {
  const auto n_vocab = static_cast<int32_t>(logits.size());
  for (const std::vector<int32_t>& word : params.bad_words_token_ids) {
    if (word.empty() || word.back() < 0 || word.back() >= n_vocab) continue;
    const size_t before = word.size() - 1;
    if (output.size() < before) continue;
    if (std::equal(word.begin(), word.end() - 1, output.end() - static_cast<ptrdiff_t>(before)))
      logits[word.back()] = -INFINITY;
  }
}

void apply_logit_bias(const SamplingParams& params, std::span<float> logits) {
  const auto n_vocab = static_cast<int32_t>(logits.size());
  for (const auto& [t, bias] : params.logit_bias)
    if (t >= 0 && t < n_vocab) logits[t] += bias;
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
