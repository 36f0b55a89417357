// What the engine reports about a request after each step: cumulative text and token ids per
// parallel sample, the delta since the previous report (for streaming), finish reasons and
// timing for metrics.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sample/logprobs.h"

namespace vesper::engine {

// The sampled token's log-probability (under the model's raw distribution) and the top-k.
using sample::LogprobEntry;
using sample::TokenLogprob;

// One of a request's n samples. Each step's output carries what is new (the delta_* fields); the
// final output (finish_reason set) also carries everything (text, token_ids, logprobs), so that
// streaming costs O(new tokens) per step and a non-streaming caller reads only the last output.
struct CompletionOutput {
  int32_t index = 0;  // which of the n samples

  std::string delta_text;                // text that became final in this step
  std::vector<int32_t> delta_token_ids;  // ids generated in this step
  std::vector<LogprobEntry> delta_logprobs;

  std::string text;                    // final output only: the whole text
  std::vector<int32_t> token_ids;      // final output only: every generated id (stop/EOS included)
  std::vector<LogprobEntry> logprobs;  // final output only (when logprobs were asked)

  std::optional<std::string> finish_reason;  // "stop", "length" or "abort" once finished
  std::optional<std::string> stop_string;    // the stop string that matched, if any
  std::optional<int32_t> stop_token;         // the stop token id that matched (not EOS), if any
  // The output's constraint gave up (sched::SampledSequence::constraint_error): why.
  std::optional<std::string> constraint_error;

  bool finished() const { return finish_reason.has_value(); }
};

struct RequestMetrics {
  double arrival_time = 0;  // seconds, steady clock
  double first_scheduled_time = 0;
  double first_token_time = 0;  // 0 until the first token
  double last_token_time = 0;
  double finished_time = 0;
  int64_t num_preemptions = 0;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;  // in the final output only (the caller has it meanwhile)
  int64_t num_cached_tokens = 0;  // prompt tokens served from the prefix cache (first admission)
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  RequestMetrics metrics;
};

}  // namespace vesper::engine
