// SamplingParams: how one request turns logits into tokens (vLLM's names and defaults).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "grammar/compiled_grammar.h"

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

  // Request-level fields (vLLM's SamplingParams), used by the engine's output processing.
  int32_t n = 1;                        // parallel samples sharing the prompt's KV blocks
  int64_t max_tokens = 16;              // generated tokens at most
  int64_t min_tokens = 0;               // EOS and stop tokens are suppressed before this many
  std::vector<std::string> stop;        // stop strings (matched on the text)
  std::vector<int32_t> stop_token_ids;  // extra tokens that end generation
  bool ignore_eos = false;              // keep generating past end-of-sequence tokens
  int32_t logprobs = -1;  // -1: none; k >= 0: the sampled token's logprob and the top k
  bool include_stop_str_in_output = false;
  // Token-level controls (logits processors, sample/logits_processors.h).
  // OpenAI's logit_bias: added to each listed token's logit (before penalties and temperature;
  // -100 bans a token, +100 all but forces it). Values in [-100, 100].
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::vector<int32_t> allowed_token_ids;  // vLLM's: when non-empty, only these can be drawn
  // vLLM's bad_words: no output may end with one of them. The engine tokenizes each (as text at
  // the start and, with a space, in the middle of a text) into bad_words_token_ids at admission;
  // a word's last token is banned wherever the output already ends with the tokens before it.
  std::vector<std::string> bad_words;
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Structured output (JSON schema, regex, choice, GBNF): the compiled grammar the output must
  // follow, shared by every request that sent the same constraint; null for free text.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  bool skip_special_tokens = true;  // special tokens are not rendered in the text
  // vLLM's: logprobs name each token "token_id:<id>" instead of its text (for clients that need
  // the ids, which a token's text does not always give back).
  bool return_tokens_as_token_ids = false;

  // Prefix caching (request options that travel with the sampling parameters, as in vLLM).
  bool skip_reading_prefix_cache = false;  // compute the whole prompt (its blocks are still cached)
  std::string cache_salt;                  // requests share cached KV only with equal salts
  // "kv_sparsity": "none": this request attends densely and keeps all its KV blocks, whatever
  // KV sparsity the server runs (--kv-window).
  bool kv_dense = false;

  bool greedy() const { return temperature == 0.0f || top_k == 1; }

  // Checks ranges; the error names the field (e.g. "temperature must be >= 0, got -1").
  Status validate() const;
  // Checks that every token id the parameters name (logit_bias, allowed_token_ids,
  // stop_token_ids, bad_words_token_ids) is in a vocabulary of n_vocab tokens.
  Status validate_token_ids(int32_t n_vocab) const;
};

}  // namespace vesper::sample
