// SamplingParams: how one request turns logits into tokens (vLLM's names and defaults).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/result.h"

namespace vesper::sample {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int32_t top_k = -1;               // -1 or 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // over prompt and output tokens; 1 = off
  float presence_penalty = 0.0f;    // over output tokens
  float frequency_penalty = 0.0f;   // over output tokens
  std::optional<uint64_t> seed;     // unset: a random seed per request

  bool greedy() const { return temperature == 0.0f || top_k == 1; }

  // Checks ranges; the error names the field (e.g. "temperature must be >= 0, got -1").
  Status validate() const;
};

}  // namespace vesper::sample
