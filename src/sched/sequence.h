// Sequence: the unit the scheduler schedules: a token list (prompt then output) and how much
// of it has its KV in the cache, plus speculative tokens proposed for it. Every sequence is the
// same kind of thing (vLLM V1): no prefill or decode phase, just committed tokens, how many are
// computed, and what a step gives it to compute. A request with n > 1 parallel samples owns n
// sequences, forked from the first once its prompt is computed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler_output.h"

namespace vesper::sched {

using kv::SeqId;

enum class SeqStatus { kWaiting, kRunning, kSwapped, kFinished };

struct Sequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // committed: prompt followed by generated tokens
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;  // committed tokens whose K/V are in the cache
  // Speculative decoding: tokens proposed to follow `tokens`, to be verified by the next step
  // that schedules the sequence up to its end (set_spec_tokens), and those a step is verifying
  // (scheduled, not yet accepted or rejected: accept_spec_tokens).
  std::vector<int32_t> spec_token_ids;
  std::vector<int32_t> spec_in_flight;
  // Empty for a chain of proposals; else each proposal's parent (-1: the last committed token).
  std::vector<int32_t> spec_tree_parents;
  std::vector<int32_t> spec_tree_in_flight;
  int64_t max_total_tokens = 0;  // prompt + max output: the most this sequence can grow to
  int32_t priority = 0;          // lower is served first (vLLM)
  int64_t arrival = 0;           // arrival order; ties in priority go to the earlier
  SeqStatus status = SeqStatus::kWaiting;
  int64_t num_preemptions = 0;

  // Prefix caching. Sequences share cached blocks only when their salts are equal (vLLM's
  // cache_salt: e.g. per tenant, so one cannot probe another's prompts through timing).
  std::string cache_salt;
  bool skip_prefix_cache_read = false;  // compute every token; the blocks are still cached
  // The adapter (LoRA / VeRA) the sequence runs with (0: the base model): roots the prefix
  // cache's chain and counts toward SchedulerConfig::max_loras; the runner maps it to a loaded
  // copy (NewSequenceData::adapter).
  uint64_t adapter_id = 0;
  kv::BlockHash prefix_root;  // root of the block hash chain (set by Scheduler::add)

  // How it samples (carried to the runner in the plan that first schedules it), and the parallel
  // samples to fork from it in the step that completes its prompt (n > 1: ids and seeds of the
  // children, decided when the request was added).
  SamplingSetup sampling;
  std::vector<ForkData> forks;
  // KIVI with a draft model: the leading positions whose rows the draft's cache holds, as the
  // runner last reported (ModelRunnerOutput); compaction quantizes only groups wholly before it.
  int64_t companion_rows = 0;
  // The loaded adapter copy pinned for it while the runner holds its KV (-1: none).
  int32_t adapter_slot = -1;

  // Tokens a planned step samples whose ids the scheduler has not read yet (update() brings them):
  // a multi-step plan's, or with async scheduling the step in flight's. The next step computes
  // the first of them (the runner has it) like any committed token.
  int64_t num_output_placeholders = 0;
  // Which of SchedulerConfig::virtual_engines schedules it (0 with one).
  int32_t virtual_engine = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  // Committed tokens and placeholders: the length the sequence will have once update() ran.
  int64_t num_tokens_planned() const { return num_tokens() + num_output_placeholders; }
  int64_t num_uncomputed() const { return num_tokens_planned() - num_computed_tokens; }
  bool in_prefill() const { return num_computed_tokens < num_prompt_tokens; }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
};

// Scheduling order: priority, then arrival, then id (deterministic).
inline bool served_before(const Sequence& a, const Sequence& b) {
  if (a.priority != b.priority) return a.priority < b.priority;
  if (a.arrival != b.arrival) return a.arrival < b.arrival;
  return a.id < b.id;
}

}  // namespace vesper::sched
