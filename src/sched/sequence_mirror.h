// SequenceMirror: what a runner holds of its sequences, kept up to date from step plans
// (sched/scheduler_output.h) and from what the runner samples itself: committed tokens, the block
// table while the sequence is resident, its adapter slot, and its sampling state (parameters,
// random stream, grammar cursor). The runner in the engine keeps one; so does anything else that
// runs steps from plans (another process, a test replaying serialized plans).
//
// Entries live from the plan that first schedules a sequence (or forks it) until a plan lists it
// as finished; preemption drops only the table (the sampling state survives, so a seeded request
// draws the same tokens however often it is preempted). Block references are counted over the
// resident tables, so a runner knows which blocks a sequence holds alone (a draft model writes
// only into those).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "grammar/compiled_grammar.h"
#include "sched/scheduler_output.h"

namespace vesper::sched {

class SequenceMirror {
 public:
  struct Entry {
    // Committed tokens: the prompt, then outputs, including what the runner sampled in steps the
    // scheduler has not read yet.
    std::vector<int32_t> tokens;
    int64_t num_prompt_tokens = 0;
    bool resident = false;  // holds a block table (not preempted)
    std::vector<kv::BlockId> block_table;
    int32_t adapter = -1;          // adapter slot (NewSequenceData::adapter)
    int64_t quantized_groups = 0;  // KIVI: quantized groups at the front of block_table
    int64_t num_computed = 0;      // positions computed, as of the last plan that scheduled it
    SamplingSetup sampling;
    std::mt19937_64 rng;                    // its random stream, seeded from sampling.seed
    grammar::GrammarCursor grammar_cursor;  // its place in sampling.params->grammar
    bool stopped = false;                   // a token-level stop ended it: nothing more to sample

    std::span<const int32_t> prompt() const {
      return {tokens.data(), static_cast<size_t>(num_prompt_tokens)};
    }
    std::span<const int32_t> output() const {
      return {tokens.data() + num_prompt_tokens,
              tokens.size() - static_cast<size_t>(num_prompt_tokens)};
    }
  };

  // What the runner's storage and vocabulary hold: plans naming other blocks or tokens are refused
  // (0: not checked).
  void set_bounds(int64_t num_blocks, int32_t n_vocab) {
    num_blocks_ = num_blocks;
    n_vocab_ = n_vocab;
  }

  // Applies a plan's finished, preempted, new and cached parts, in that order, checks its
  // scheduled entries, then applies its forks. An error (what came before the fault applied) when
  // the plan does not fit what the mirror holds: a new sequence it already holds, a cached one it
  // does not, a replaced entry outside the table, fewer tokens than the scheduler knows of, a
  // block or token outside the bounds, a scheduled sequence it does not hold resident, whose
  // tokens do not reach the entry's committed end, or that samples but ends before the tokens do
  // (unless a token ended it: the plan was made before that was known), a fork whose parent does
  // not sample in the plan or comes out of the plan's order.
  Status apply(const SchedulerOutput& plan);

  Entry* find(SeqId id);
  const Entry* find(SeqId id) const;
  size_t size() const { return seqs_.size(); }
  const std::unordered_map<SeqId, Entry>& entries() const { return seqs_; }
  // Tokens the runner sampled for `id`, appended to its committed tokens.
  void append(SeqId id, std::span<const int32_t> tokens);
  // How many resident tables hold block `b`.
  int32_t block_refs(kv::BlockId b) const {
    return static_cast<size_t>(b) < refs_.size() ? refs_[static_cast<size_t>(b)] : 0;
  }

 private:
  void count(const std::vector<kv::BlockId>& table, int32_t delta);

  Status check_blocks(SeqId id, std::span<const kv::BlockId> blocks) const;

  std::unordered_map<SeqId, Entry> seqs_;
  std::vector<int32_t> refs_;  // per block id
  int64_t num_blocks_ = 0;
  int32_t n_vocab_ = 0;
};

}  // namespace vesper::sched
