#include "sample/sampling_params.h"

#include <cmath>
#include <sstream>

namespace vesper::sample {
namespace {
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

Status SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return make_error("temperature must be a finite number >= 0, got " + num(temperature));
  if (top_k < -1)
    return make_error("top_k must be -1 (off), 0 (off) or positive, got " + num(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return make_error("top_p must be in (0, 1], got " + num(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return make_error("min_p must be in [0, 1], got " + num(min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return make_error("repetition_penalty must be > 0, got " + num(repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return make_error("presence_penalty must be in [-2, 2], got " + num(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return make_error("frequency_penalty must be in [-2, 2], got " + num(frequency_penalty));
  if (n < 1) return make_error("n must be at least 1, got " + num(n));
  if (max_tokens < 0)
    return make_error("max_tokens must be >= 0, got " + num(static_cast<double>(max_tokens)));
  if (min_tokens < 0)
    return make_error("min_tokens must be >= 0, got " + num(static_cast<double>(min_tokens)));
  if (min_tokens > max_tokens)
    return make_error("min_tokens (" + num(static_cast<double>(min_tokens)) +
                      ") must not exceed max_tokens (" + num(static_cast<double>(max_tokens)) +
                      ")");
  if (logprobs < -1 || logprobs > 20)
    return make_error("logprobs must be between 0 and 20, got " + num(logprobs));
  for (const auto& s : stop)
    if (s.empty()) return make_error("stop strings must not be empty");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return make_error("logit_bias token id must be >= 0, got " + num(id));
    if (!(bias >= -100.0f && bias <= 100.0f))
      return make_error("logit_bias[" + num(id) + "] must be in [-100, 100], got " + num(bias));
  }
  for (int32_t id : allowed_token_ids)
    if (id < 0) return make_error("allowed_token_ids must be >= 0, got " + num(id));
  for (const auto& w : bad_words)
    if (w.empty()) return make_error("bad_words must not be empty strings");
  return {};
}

Status SamplingParams::validate_token_ids(int32_t n_vocab) const {
  auto check = [&](int32_t id, const char* field) -> Status {
    if (id < 0 || id >= n_vocab)
      return make_error(std::string(field) + ": token id " + num(id) +
                        " is outside the vocabulary (0.." + num(n_vocab - 1) + ")");
    return {};
  };
  for (const auto& [id, bias] : logit_bias) VESPER_TRY(check(id, "logit_bias"));
  for (const int32_t id : allowed_token_ids) VESPER_TRY(check(id, "allowed_token_ids"));
  for (const int32_t id : stop_token_ids) VESPER_TRY(check(id, "stop_token_ids"));
  for (const auto& word : bad_words_token_ids)
    for (const int32_t id : word) VESPER_TRY(check(id, "bad_words"));
  return {};
}

}  // namespace vesper::sample
