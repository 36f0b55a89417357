// Sampling: turning a row of logits into a token id under SamplingParams, deterministically for
// a given seed. The order follows vLLM: logits processors (min_tokens, penalties:
// logits_processors.h), temperature, top-k, top-p, min-p, then a draw from the remaining
// distribution. Greedy picks the first maximum (as llama.cpp's argmax).
//
// BatchSampler is what the runner uses: one step's rows of many sequences in one call, spread
// over the compute threads, each with one set of vocabulary-sized scratch. Sampler is the same
// computation for one sequence with scratch of its own: the reference the batched sampler is tested
// against, and handy in tests. Given the same logits, history and random state they draw the same
// tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "sample/logits_processors.h"
#include "sample/logprobs.h"
#include "sample/sampling_params.h"

namespace vesper::sample {

// Index of the largest value; the first one wins ties.
int32_t argmax(std::span<const float> logits);

// e^x in float for x <= 0 (about 1 ulp; 0 below -87, under float's normal range, and for -inf):
// branch-free and call-free, so that a loop over a vocabulary vectorizes. Sampling's weights
// e^((logit - max) / temperature) are computed with it.
float exp_nonpositive(float x);

// A sequence's random state: seeded from SamplingParams::seed (random when unset).
std::mt19937_64 make_rng(const SamplingParams& params);

// The distribution sampling draws from, for a row the processors have already seen: the kept
// candidates in scratch.candidates[0, n) and their unnormalised weights in scratch.probs[0, n),
// after temperature, top-k, top-p and min-p. The candidates are in descending order of logit
// (ties by id) when top-k, top-p or min-p is set, else the whole vocabulary in id order (nothing
// needs the order then, and sorting the vocabulary for every token costs). Greedy: the argmax
// alone, weight 1. Returns n.
size_t kept_distribution(const SamplingParams& params, std::span<const float> logits,
                         SamplingScratch& scratch);

// Temperature, top-k, top-p, min-p and the draw, on a row the processors have already seen;
// greedy is argmax and draws nothing.
int32_t draw_token(const SamplingParams& params, std::span<float> logits, std::mt19937_64& rng,
                   SamplingScratch& scratch);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Samples from `logits` (modified in place by the logits processors and scaling; it knows no
  // end-of-generation tokens, so min_tokens holds back only stop_token_ids). `prompt` and
  // `output` are the sequence's token ids so far, for the processors.
  int32_t sample(std::span<float> logits, std::span<const int32_t> prompt,
                 std::span<const int32_t> output);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  SamplingScratch scratch_;
};

class BatchSampler {
 public:
  // `pool`: threads a batch's rows are spread over (null: the calling thread alone).
  explicit BatchSampler(int32_t n_vocab, ThreadPool* pool = nullptr);

  // One sequence's row of a step.
  struct Row {
    const SamplingParams* params = nullptr;
    std::mt19937_64* rng = nullptr;
    TokenHistory history;
    std::span<const float> logits;  // the raw row (left as it is)
    // Filled with the drawn token's logprob and the top params->logprobs, when that is >= 0.
    LogprobEntry* logprob = nullptr;
    // Where the processed row goes (the processors' and temperature's changes); empty: scratch.
    std::span<float> processed = {};
  };

  // Runs the logits processors (with `eog_ids`, the vocabulary's end-of-generation tokens, for
  // min_tokens) and draws one token per row into `tokens`. Each row reads only its own logits,
  // history and random stream, so the rows are spread over the pool's threads and draw the same
  // tokens however they are spread.
  void sample(std::span<const Row> rows, std::span<const int32_t> eog_ids,
              std::span<int32_t> tokens);
  int32_t sample_one(const Row& row, std::span<const int32_t> eog_ids);

 private:
  // One thread's scratch: the processors' vocabulary-sized buffers and a row to process into.
  struct Scratch {
    explicit Scratch(int32_t n_vocab) : sampling(n_vocab), row(static_cast<size_t>(n_vocab)) {}
    SamplingScratch sampling;
    std::vector<float> row;
    LogprobScratch logprobs;
  };
  int32_t sample_row(const Row& row, std::span<const int32_t> eog_ids, Scratch& scratch);

  ThreadPool* pool_;
  std::vector<Scratch> scratch_;  // one per pool thread
};

}  // namespace vesper::sample
