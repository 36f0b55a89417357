// The token-level stop conditions (vLLM's, checked per sampled token): an end-of-generation token
// (unless ignore_eos), one of stop_token_ids, max_tokens generated, or max_model_len reached. The
// runner checks them as it samples (a multi-token step ends a sequence exactly at the token that
// stops it) and output processing checks the same, with stop strings on top.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "sample/sampling_params.h"

namespace vesper::sample {

enum class TokenStop {
  kNone,
  kStop,    // an end-of-generation token or a stop token id: finish_reason "stop"
  kLength,  // max_tokens or max_model_len: finish_reason "length"
};

// Whether `token`, the sequence's num_generated-th output (counting it), ends it; the sequence is
// then num_tokens long. `eog_ids`: the vocabulary's end-of-generation tokens.
inline TokenStop token_stop(const SamplingParams& params, int32_t token, int64_t num_generated,
                            int64_t num_tokens, int64_t max_model_len,
                            std::span<const int32_t> eog_ids) {
  const bool stop_token = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                    token) != params.stop_token_ids.end();
  const bool eos =
      !params.ignore_eos && std::find(eog_ids.begin(), eog_ids.end(), token) != eog_ids.end();
  if (stop_token || eos) return TokenStop::kStop;
  if (num_generated >= params.max_tokens || num_tokens >= max_model_len) return TokenStop::kLength;
  return TokenStop::kNone;
}

}  // namespace vesper::sample
