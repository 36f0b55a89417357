#include "sample/logprobs.h"

#include <algorithm>
#include <cmath>

namespace vesper::sample {

double log_normalizer(std::span<const float> logits) {
  float max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  return static_cast<double>(max_logit) + std::log(sum);
}

LogprobEntry compute_logprobs(std::span<const float> logits, int32_t token, int32_t k,
                              LogprobScratch& scratch) {
  const auto n_vocab = static_cast<int64_t>(logits.size());
  const double log_z = log_normalizer(logits);
  LogprobEntry e;
  e.token = token;
  e.logprob = static_cast<float>(logits[token] - log_z);
  if (k > 0) {
    std::vector<int32_t>& order = scratch.order;
    order.resize(n_vocab);
    for (int64_t i = 0; i < n_vocab; ++i) order[i] = static_cast<int32_t>(i);
    const int64_t kk = std::min<int64_t>(k, n_vocab);
    std::partial_sort(order.begin(), order.begin() + kk, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    e.top.reserve(kk);
    for (int64_t i = 0; i < kk; ++i)
      e.top.push_back({order[i], static_cast<float>(logits[order[i]] - log_z)});
  }
  return e;
}

}  // namespace vesper::sample
