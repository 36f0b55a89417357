// SequenceOutput: output processing of one generated sequence: incremental detokenization, stop
// strings matched on the text, stop tokens, EOS and length limits, and the stream of deltas.
//
// A partial match of a stop string is never streamed and then retracted: text that could be the
// start of a stop string is held back until it is known not to be one. When a stop string
// matches, the text ends before it (or after it with include_stop_str_in_output).
#pragma once

#include <string>
#include <vector>

#include "engine/request_output.h"
#include "sample/sampling_params.h"
#include "tokenizer/incremental_detokenizer.h"

namespace vesper::engine {

class SequenceOutput {
 public:
  SequenceOutput(const tokenizer::Tokenizer& tokenizer, const sample::SamplingParams& params,
                 int32_t index);

  // Adds a generated token (with its logprobs when asked). `at_length_limit` says the sequence
  // has reached max_model_len. Finishes the sequence when a stop condition holds.
  void add_token(int32_t token, const LogprobEntry* logprob, bool at_length_limit);
  // The sequence's constraint gave up (reported with its final output).
  void set_constraint_error(const std::string& why) { constraint_error_ = why; }
  // Ends the sequence with finish_reason "abort".
  void abort();

  bool finished() const { return finish_reason_.has_value(); }
  int64_t num_generated() const { return static_cast<int64_t>(token_ids_.size()); }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

  // True when something happened since the last take_output() (new tokens or finishing).
  bool has_update() const { return pending_tokens_ > 0 || (finished() && !reported_finish_); }
  // The delta since the previous call (and the whole output once finished).
  CompletionOutput take_output();

 private:
  void finish(const std::string& reason);
  // Looks for a stop string in the text; truncates and finishes when one is found.
  void check_stop_strings();
  // Bytes at the end of text_ that could begin a stop string and so must be held back.
  size_t held_back() const;

  const sample::SamplingParams& params_;
  int32_t index_;
  tokenizer::IncrementalDetokenizer detok_;
  std::string text_;
  size_t emitted_ = 0;  // bytes of text_ already reported
  size_t stop_checked_ =
      0;  // text_ before this offset holds no stop string start that could still match
  std::vector<int32_t> token_ids_;
  std::vector<LogprobEntry> logprobs_;
  size_t pending_tokens_ = 0;
  std::optional<std::string> finish_reason_;
  std::optional<std::string> stop_string_;
  std::optional<int32_t> stop_token_;
  std::optional<std::string> constraint_error_;
  bool reported_finish_ = false;
};

}  // namespace vesper::engine
