// The requests of a serving benchmark: a prompt and how many tokens to generate.
//
// Random prompts need no tokenizer: a prompt of "about I tokens" is I words drawn uniformly from a
// list of common English words, separated by spaces. Each of these words is one token in the
// vocabularies of llama-family models (SentencePiece or BPE with 32k+ entries), so the prompt is
// about I tokens plus BOS; with a small vocabulary (stories260K's 512 tokens) words split into
// several tokens and the prompt is longer. The reported input tokens come from the server's usage
// object when it sends one, so they are exact either way; `prompt_len` here is only the estimate
// used when the server reports none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"

namespace vesper::client {

struct BenchRequest {
  std::string prompt;
  int64_t prompt_len = 0;  // estimated tokens: words in the prompt
  int64_t output_len = 0;  // max_tokens
  std::string model = {};  // the "model" to request (an adapter); empty: the run's model
  int64_t lora_id = -1;    // llama-server's per-request adapter ("lora": [{"id", "scale": 1}])
};

// `num_requests` prompts of `input_len` random common words each, different per request;
// the same seed gives the same prompts.
std::vector<BenchRequest> random_requests(int64_t num_requests, int64_t input_len,
                                          int64_t output_len, uint64_t seed);

// A JSONL file with one {"prompt": string, "output_len": integer} per line (output_len defaults
// to `default_output_len`); the first `max_requests` lines that are not blank.
Result<std::vector<BenchRequest>> load_dataset(const std::string& path, int64_t max_requests,
                                               int64_t default_output_len);

// Words separated by whitespace: the token estimate of a prompt.
int64_t count_words(const std::string& text);

}  // namespace vesper::client
