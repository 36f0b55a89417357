// Logits processors: what changes one sequence's row of logits before a token is drawn from it,
// applied by apply_logits_processors in vLLM's order:
//  1. allowed_token_ids: every other token is masked out;
//  2. bad_words: a word's last token is masked where the output ends with the tokens before it;
//  3. min_tokens: before a sequence has `min_tokens` outputs, its end-of-generation tokens and
//     stop token ids cannot be drawn;
//  4. logit_bias: added to the listed tokens' logits;
//  5. penalties (vLLM's): repetition over prompt and output tokens, presence and frequency over
//     output tokens.
//  0. grammar (structured output): tokens the grammar does not allow next are masked out, and
//     end-of-generation tokens are allowed exactly where the grammar is complete
//     (grammar/compiled_grammar.h). First, as vLLM applies its bitmask before sampling.
//
// Processors read a sequence's history and write only its row, so a row's result never depends
// on the other rows of a batch. Scratch is shared by all rows and allocated once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sample/sampling_params.h"

namespace vesper::sample {

// The tokens a sequence's processors read: its prompt and what it has generated so far.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  // The sequence's place in params.grammar, kept between steps (null: walk from the start).
  grammar::GrammarCursor* grammar_cursor = nullptr;
};

// Vocabulary-sized scratch for sampling, allocated once and reused by every row of every step.
// counts and seen are all zero between uses: a use clears only the entries it touched, so a row
// costs O(its history), not O(vocabulary), to penalise.
struct SamplingScratch {
  explicit SamplingScratch(int32_t n_vocab);

  std::vector<int32_t> counts;   // occurrences of each token in the output
  std::vector<uint8_t> seen;     // marks each distinct history token once
  std::vector<int32_t> touched;  // the tokens marked in `seen`
  std::vector<int32_t> candidates;
  std::vector<float> probs;
};

// All of the above, in order: what every sampling path (plain, batched, speculative verification)
// calls.
void apply_logits_processors(const SamplingParams& params, const TokenHistory& history,
                             std::span<const int32_t> eog_ids, std::span<float> logits,
                             SamplingScratch& scratch);

void apply_grammar(const SamplingParams& params, const TokenHistory& history,
                   std::span<float> logits);
void apply_allowed_token_ids(const SamplingParams& params, std::span<float> logits,
                             SamplingScratch& scratch);
void apply_bad_words(const SamplingParams& params, std::span<const int32_t> output,
                     std::span<float> logits);
void apply_logit_bias(const SamplingParams& params, std::span<float> logits);
void apply_min_tokens(const SamplingParams& params, int64_t num_generated,
                      std::span<const int32_t> eog_ids, std::span<float> logits);
void apply_penalties(const SamplingParams& params, const TokenHistory& history,
                     std::span<float> logits, SamplingScratch& scratch);

}  // namespace vesper::sample
