// Sampler: turns one row of logits into a token id under SamplingParams, deterministically for a
// given seed. The order follows vLLM: penalties, temperature, top-k, top-p, min-p, then a draw
// from the remaining distribution. Greedy picks the first maximum (as llama.cpp's argmax).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "sample/sampling_params.h"

namespace vesper::sample {

// Index of the largest value; the first one wins ties.
int32_t argmax(std::span<const float> logits);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Samples from `logits` (modified in place by penalties and scaling). `prompt` and `output`
  // are the sequence's token ids so far, for the penalties.
  int32_t sample(std::span<float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> output);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt,
                       std::span<const int32_t> output);

  SamplingParams params_;
  std::mt19937_64 rng_;
  // Scratch reused across calls.
  std::vector<int32_t> candidates_;
  std::vector<float> probs_;
  std::vector<int32_t> counts_;
};

}  // namespace vesper::sample
