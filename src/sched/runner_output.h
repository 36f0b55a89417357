// ModelRunnerOutput: what a runner returns for one step plan (vLLM V1's ModelRunnerOutput), and
// what Scheduler::update consumes. For every scheduled entry that sampled (and every sequence
// forked in the step): the tokens it committed, their logprobs when asked, how its proposals
// fared, whether its last token ends it, and what the runner proposes to verify next.
//
// The runner applies the token-level stop conditions itself (sample/stop_conditions.h: EOS, stop
// token ids, max_tokens, max_model_len): a sequence's tokens end at the first that stops it, and
// `finished` says so. Stop strings are text, matched by output processing (the engine ends those
// sequences itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sample/logprobs.h"

namespace vesper::sched {

using kv::SeqId;

struct SampledSequence {
  SeqId id = 0;
  // New committed tokens, in order: the proposals kept (verification), then the token drawn after
  // them.
  std::vector<int32_t> token_ids;
  std::vector<sample::LogprobEntry> logprobs;  // one per token, when the request asked
  int64_t num_proposals = 0;                   // proposals this step verified
  int64_t num_accepted = 0;                    // of them kept: the first num_accepted of token_ids
  bool finished = false;                       // the last token ends the sequence
  // Why the output's constraint gave up (a grammar too ambiguous to follow), when it did at this
  // step: the constraint then allows only an end-of-generation token, so the sequence ends.
  std::string constraint_error;
  // Speculative tokens for the step after (a chain, or a tree with each proposal's parent).
  std::vector<int32_t> proposals;
  std::vector<int32_t> proposal_parents;
  // KIVI with a draft model: the leading positions whose rows the draft's cache holds (a group is
  // quantized only once it has them); -1: nothing limits compaction.
  int64_t companion_rows = -1;
};

struct ModelRunnerOutput {
  std::vector<SampledSequence> sequences;  // in plan order, each fork's child after its parent
};

}  // namespace vesper::sched
