// AttentionWindow: which positions a query attends under StreamingLLM's sinks + window, the one
// definition the KV manager (which blocks it may free), the batch builder (each row's gap) and
// paged attention (what a row reads) share.
#pragma once

#include <algorithm>
#include <cstdint>

namespace vesper::backend {

// StreamingLLM's attention sinks and window (Xiao et al., ICLR 2024; --kv-sink-tokens,
// --kv-window): a query at position p attends the first sink_tokens positions and the last
// `window` ones up to its own, except queries at positions before `dense_from` (a prompt's,
// whose prefill stays dense), which attend everything. window 0: off.
struct AttentionWindow {
  int64_t sink_tokens = 0;
  int64_t window = 0;
  int64_t dense_from = 0;  // per sequence: its prompt's length

  bool enabled() const { return window > 0; }
  // A server's window as one sequence attends with it: from the end of its prompt of
  // `prompt_tokens`, or not at all for a request that opted out (`dense`).
  AttentionWindow for_sequence(int64_t prompt_tokens, bool dense) const {
    if (!enabled() || dense) return {};
    AttentionWindow w = *this;
    w.dense_from = prompt_tokens;
    return w;
  }
  // The first position a query at `position` skips, and the one after its last skipped; equal
  // when it skips none.
  int64_t gap_begin() const { return sink_tokens; }
  int64_t gap_end(int64_t position) const {
    if (!enabled() || position < dense_from) return sink_tokens;
    return std::max(sink_tokens, position + 1 - window);
  }
};

}  // namespace vesper::backend
