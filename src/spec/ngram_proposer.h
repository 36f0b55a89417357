// N-gram prompt lookup (vLLM's "[ngram]" proposer; Saxena's prompt lookup decoding): a sequence
// whose output repeats something earlier in its prompt or output (summaries, code edits, quoted
// passages) proposes the tokens that followed the most recent earlier occurrence of its last n
// tokens, trying n from `max_n` down to `min_n`. Needs no model; q is one-hot.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "spec/proposer.h"

namespace vesper::spec {

struct NgramConfig {
  int32_t min_n = 1;  // --ngram-prompt-lookup-min
  int32_t max_n = 4;  // --ngram-prompt-lookup-max
};

// Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix of
// `tokens` (of min_n..max_n tokens) found earlier in `tokens`; empty when none matches. Appends
// to `out` (cleared first).
void propose_ngram(std::span<const int32_t> tokens, const NgramConfig& config, int64_t k,
                   std::vector<int32_t>& out);

// The proposer: each sequence's proposals are propose_ngram over its tokens (prompt and output).
class NgramProposer : public Proposer {
 public:
  explicit NgramProposer(const NgramConfig& config) : config_(config) {}
  std::string describe() const override;
  Cost cost() const override { return Cost::kFree; }
  void propose(std::span<const ProposalRequest> requests, const sched::SequenceMirror& mirror,
               const backend::Tensor& hidden, std::vector<Proposal>& out) override;

 private:
  NgramConfig config_;
};

}  // namespace vesper::spec
