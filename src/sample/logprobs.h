// Log-probabilities as the OpenAI API reports them: the sampled token's log-probability under the
// model's raw distribution (before penalties, temperature and filters, as vLLM reports by
// default) and the k most likely tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace vesper::sample {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The sampled token's log-probability and the top-k (descending; ties by id).
struct LogprobEntry {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

// Scratch for the top-k search, reused across calls (sized to the vocabulary once).
struct LogprobScratch {
  std::vector<int32_t> order;
};

// log(sum_i exp(logits[i])), the log-softmax normaliser: the sum in f64 over exp(logit - max), so
// it does not depend on how a batch was laid out. log p(i) = logits[i] - log_normalizer(logits).
double log_normalizer(std::span<const float> logits);

// log softmax(logits)[token] and the top k entries (k may exceed the vocabulary). The
// normaliser is a double sum, so the result does not depend on how a batch was laid out.
LogprobEntry compute_logprobs(std::span<const float> logits, int32_t token, int32_t k,
                              LogprobScratch& scratch);

}  // namespace vesper::sample
