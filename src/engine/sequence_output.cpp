#include "engine/sequence_output.h"

#include <algorithm>

namespace vesper::engine {

SequenceOutput::SequenceOutput(const tokenizer::Tokenizer& tokenizer,
                               const sample::SamplingParams& params, int32_t index)
    : params_(params),
      index_(index),
      detok_(tokenizer,
             tokenizer::DetokenizeOptions{params.skip_special_tokens, /*continuation=*/true}) {}

void SequenceOutput::add_token(int32_t token, const LogprobEntry* logprob, bool at_length_limit) {
  if (finished()) return;
  token_ids_.push_back(token);
  ++pending_tokens_;
  if (logprob != nullptr) logprobs_.push_back(*logprob);
  const bool is_stop_token = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(),
                                       token) != params_.stop_token_ids.end();
  const bool is_eos = !params_.ignore_eos && detok_.tokenizer().is_eog(token);
  if (is_stop_token || is_eos) {
    if (is_stop_token && !is_eos) stop_token_ = token;
    text_ += detok_.flush();
    check_stop_strings();
    if (!finished()) finish("stop");
    return;
  }
  text_ += detok_.feed(token);
  check_stop_strings();
  if (finished()) return;
  if (num_generated() >= params_.max_tokens || at_length_limit) {
    text_ += detok_.flush();
    check_stop_strings();
    if (!finished()) finish("length");
  }
}

void SequenceOutput::abort() {
  if (finished()) return;
  text_ += detok_.flush();
  finish("abort");
}

void SequenceOutput::finish(const std::string& reason) {
  finish_reason_ = reason;
}

void SequenceOutput::check_stop_strings() {
  if (params_.stop.empty()) return;
  size_t longest = 0;
  for (const auto& s : params_.stop) longest = std::max(longest, s.size());
  // A match must end in the new text, so it starts at most longest-1 bytes before it.
  const size_t from = stop_checked_ >= longest ? stop_checked_ - (longest - 1) : 0;
  size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (const auto& s : params_.stop) {
    const size_t at = text_.find(s, from);
    if (at != std::string::npos && at < best) {
      best = at;
      matched = &s;
    }
  }
  stop_checked_ = text_.size();
  if (matched == nullptr) return;
  stop_string_ = *matched;
  text_.resize(best + (params_.include_stop_str_in_output ? matched->size() : 0));
  if (emitted_ > text_.size())
    emitted_ = text_.size();  // cannot happen: partial matches are held back
  finish("stop");
}

size_t SequenceOutput::held_back() const {
  size_t hold = 0;
  for (const auto& s : params_.stop) {
    // The longest proper prefix of s that is a suffix of text_.
    for (size_t len = std::min(s.size() - 1, text_.size()); len > hold; --len) {
      if (text_.compare(text_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

CompletionOutput SequenceOutput::take_output() {
  CompletionOutput out;
  out.index = index_;
  const size_t stable = finished() ? text_.size() : text_.size() - held_back();
  if (stable > emitted_) {
    out.delta_text = text_.substr(emitted_, stable - emitted_);
    emitted_ = stable;
  }
  out.delta_token_ids.assign(token_ids_.end() - static_cast<std::ptrdiff_t>(pending_tokens_),
                             token_ids_.end());
  if (!logprobs_.empty())
    out.delta_logprobs.assign(
        logprobs_.end() - static_cast<std::ptrdiff_t>(std::min(pending_tokens_, logprobs_.size())),
        logprobs_.end());
  pending_tokens_ = 0;
  if (finished()) {
    out.text = text_;
    out.token_ids = token_ids_;
    out.logprobs = logprobs_;
    out.finish_reason = finish_reason_;
    out.stop_string = stop_string_;
    out.stop_token = stop_token_;
    out.constraint_error = constraint_error_;
    reported_finish_ = true;
  }
  return out;
}

}  // namespace vesper::engine
