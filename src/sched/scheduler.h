// Scheduler: vLLM's iteration-level scheduler. Each step answers two questions in order: which
// sequences fit in KV memory (capacity, preempting when blocks run out), then how many tokens
// each computes this step (the token budget, with chunked prefill).
//
// Policy (Sarathi-Serve's stall-free batching):
//  1. running decodes first, in priority order;
//  2. then running, partly prefilled prompts, as chunks that fill the token budget;
//  3. then swapped-out sequences, swapped back in while blocks allow (for their blocks and the
//     tokens they compute next);
//  4. then waiting sequences (new or preempted by recompute), in priority order, once no
//     sequence is left swapped out. With prefix caching, a sequence starts from the longest
//     chain of cached blocks matching its tokens and computes only the rest.
// Blocks are indexed in the prefix cache as soon as a step is planned to fill them. A sequence
// admitted later in the same step may then share them: the forward pass writes every token's
// K/V of a layer before any attention of that layer reads (ModelRunner's contract). Preemption
// happens only while planning running sequences (1 and 2), before anyone can match, and takes
// back the victim's blocks indexed in this step.
// When a sequence cannot get blocks, the lowest-priority, latest-arrived running sequence is
// preempted: by recompute (blocks freed, prefilled again later) or by swap (blocks copied to the
// host pool; recompute when the pool is full). No new sequence starts in a step that preempted.
// Budgets: at most max_num_batched_tokens tokens and max_num_seqs sequences per step.
// A sequence that could never fit (longer than max_model_len or than the whole KV capacity) is
// rejected when added, so no step can deadlock; FCFS within a priority level prevents starvation.
//
// The scheduler is pure bookkeeping: it owns the Sequences and drives the KvCacheManager;
// the engine runs the step it returns and then appends sampled tokens.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_manager.h"
#include "sched/sequence.h"

namespace vesper::sched {

enum class PreemptionMode { kRecompute, kSwap };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 2048;
  bool enable_chunked_prefill = true;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
};

struct ScheduledSequence {
  SeqId id = 0;
  int64_t start = 0;          // first token computed this step (num_computed before the step)
  int64_t num_new_tokens = 0;
  bool samples = false;       // the step reaches the sequence's last token: a new token is sampled
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;
  std::vector<kv::BlockCopy> block_copies;   // copy-on-write, before the forward pass
  std::vector<kv::SwapMapping> swap_out;     // device -> host, before anything else
  std::vector<kv::SwapMapping> swap_in;      // host -> device, after swap-out
  std::vector<SeqId> preempted;              // preempted this step (either mode)
  int64_t num_batched_tokens = 0;

  bool empty() const { return scheduled.empty(); }
};

struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_swapped = 0;
  int64_t num_preemptions = 0;   // total since start
  int64_t num_swap_outs = 0;     // preemptions by swap
  int64_t num_recomputes = 0;    // preemptions by recompute
  // Prefix cache, counted in tokens each time a sequence is admitted from the waiting queue
  // (vLLM's prefix_cache_queries / prefix_cache_hits). Zero when prefix caching is off.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv);

  const SchedulerConfig& config() const { return config_; }

  // Adds a waiting sequence. Errors (nothing added) when it could never be scheduled: prompt
  // or max_total_tokens over max_model_len, more blocks than the cache has, or, with chunked
  // prefill off, a prompt or max_total_tokens over the token budget (a sequence preempted by
  // recompute must be prefilled again in one step).
  Status add(Sequence seq);

  // Plans one step and commits it: blocks are allocated, num_computed_tokens advanced.
  SchedulerOutput schedule();

  // A running sequence gains a sampled token.
  void append_token(SeqId id, int32_t token);

  // Creates `child` as a running copy of running sequence `parent`, sharing its blocks.
  void fork(SeqId parent, SeqId child);

  // Removes a sequence in any state and frees its blocks (finish and abort alike).
  void remove(SeqId id);

  const Sequence* find(SeqId id) const;
  bool has_unfinished() const { return !sequences_.empty(); }
  SchedulerStats stats() const;
  const kv::KvCacheManager& kv() const { return kv_; }

  // Aborts (via VESPER_CHECK) if the bookkeeping is inconsistent; for tests.
  void check_invariants() const;

 private:
  Sequence& get(SeqId id);
  // Grants blocks for seq's next num_new tokens, preempting others as needed. False if seq
  // itself had to be preempted (or cannot fit even alone).
  bool allocate_or_preempt(Sequence& seq, int64_t num_new, SchedulerOutput& out);
  void preempt(Sequence& victim, SchedulerOutput& out);
  void schedule_tokens(Sequence& seq, int64_t num_new, SchedulerOutput& out);
  std::vector<SeqId> ordered(SeqStatus status) const;

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::map<SeqId, Sequence> sequences_;
  SchedulerStats totals_;
};

}  // namespace vesper::sched
