// KvSparsity: which keys a query reads under KV sparsity, the one definition the KV manager
// (which blocks it may free), the batch builder (each row's gap or budget) and paged attention
// (what a row reads) share. Two methods, one per server:
//  - StreamingLLM's attention sinks + window (Xiao et al., ICLR 2024; --kv-sink-tokens,
//    --kv-window): a query at position p attends the first sink_tokens positions and the last
//    `window` ones up to its own; the positions between are its gap, and blocks wholly inside
//    every later query's gap can be freed.
//  - Quest's query-aware block selection (Tang et al., ICML 2024; --kv-sparsity quest,
//    --kv-sparse-budget): a query reads `block_budget` tokens' worth of blocks, chosen per KV
//    head by an upper bound on q.k from each block's key minima and maxima (paged_attention.h).
//    Nothing is freed.
// Queries at positions before `dense_from` (a prompt's: prefill stays dense) read everything.
#pragma once

#include <algorithm>
#include <cstdint>

namespace vesper::backend {

struct KvSparsity {
  int64_t sink_tokens = 0;
  int64_t window = 0;        // sinks + window: on when > 0
  int64_t block_budget = 0;  // Quest: tokens a query reads; on when > 0
  int64_t dense_from = 0;    // per sequence: its prompt's length

  bool windowed() const { return window > 0; }
  bool quest() const { return block_budget > 0; }
  bool enabled() const { return windowed() || quest(); }
  // A server's sparsity as one sequence reads with it: from the end of its prompt of
  // `prompt_tokens`, or not at all for a request that opted out (`dense`).
  KvSparsity for_sequence(int64_t prompt_tokens, bool dense) const {
    if (!enabled() || dense) return {};
    KvSparsity s = *this;
    s.dense_from = prompt_tokens;
    return s;
  }
  // Sinks + window: the first position a query at `position` skips, and the one after its last
  // skipped; equal when it skips none.
  int64_t gap_begin() const { return sink_tokens; }
  int64_t gap_end(int64_t position) const {
    if (!windowed() || position < dense_from) return sink_tokens;
    return std::max(sink_tokens, position + 1 - window);
  }
  // Quest: the budget of a query at `position` (0: it reads everything).
  int64_t budget(int64_t position) const {
    return quest() && position >= dense_from && position + 1 > block_budget ? block_budget : 0;
  }
};

}  // namespace vesper::backend
