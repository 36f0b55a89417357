// SpeculativeConfig: speculative decoding's settings (vLLM's flags; --speculative-config takes the
// same as JSON): which proposer, how many tokens it proposes per step, and how proposals are
// accepted.
#pragma once

#include <cstdint>
#include <string>

#include "sample/speculative_acceptance.h"
#include "spec/ngram_proposer.h"

namespace vesper::spec {

struct SpeculativeConfig {
  enum class Method { kNone, kNgram, kDraftModel, kMedusa };
  // --speculative-model "[ngram]", a draft GGUF, or a Medusa heads directory
  Method method = Method::kNone;
  std::string model;  // the draft model's GGUF or the Medusa heads' directory
  // Medusa: candidates as a sparse tree of num_speculative_tokens nodes (spec/medusa_proposer.h),
  // or false: a chain of each head's best ("medusa_tree" in --speculative-config).
  bool medusa_tree = true;
  int64_t num_speculative_tokens = 0;  // --num-speculative-tokens K: proposals per step
  // --num-speculative-tokens auto: the runner picks k in 0..num_speculative_tokens each step
  // (spec/speculation_policy.h); Medusa heads then propose chains.
  bool auto_num_speculative_tokens = false;
  NgramConfig ngram;  // --ngram-prompt-lookup-min / -max
  // --speculative-disable-by-batch-size N: no proposals while more than N requests are running
  // or waiting (0: never disabled).
  int64_t disable_by_batch_size = 0;
  sample::AcceptanceConfig acceptance;  // --spec-decoding-acceptance-method and its parameters

  bool enabled() const { return method != Method::kNone; }
};

}  // namespace vesper::spec
