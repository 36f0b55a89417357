// Scheduler: vLLM's iteration-level scheduler, on vLLM V1's one model of work: every sequence has
// committed tokens, num_computed_tokens and maybe speculative tokens, and each step gives some
// sequences some tokens to compute, under the token and sequence budgets. Each step answers two
// questions in order: which sequences fit in KV memory (capacity, preempting when blocks run
// out), then how many tokens each computes this step (the token budget, with chunked prefill).
//
// Policy (Sarathi-Serve's stall-free batching):
//  1. running sequences with one token left to compute (the token just sampled, with the
//     speculative tokens proposed after it), in priority order, so a step never stalls them;
//  2. then running sequences with more left (prompt chunks), chunks filling the token budget;
//  3. then swapped-out sequences, swapped back in while blocks allow (for their blocks and the
//     tokens they compute next);
//  4. then waiting sequences (new or preempted by recompute), in priority order, once no
//     sequence is left swapped out. With prefix caching, a sequence starts from the longest
//     chain of cached blocks matching its tokens and computes only the rest.
// Speculative tokens ride along only when the sequence is scheduled up to its last committed
// token and the budgets and KV slots allow them; otherwise it computes its own tokens that step.
// Blocks are indexed in the prefix cache as soon as a step is planned to fill them with
// committed tokens (never speculative ones). A sequence admitted later in the same step may then
// share them: the forward pass writes every token's K/V of a layer before any attention of that
// layer reads (model/model.h). Preemption happens only while planning running sequences (1 and
// 2), before anyone can match, and takes back the victim's blocks indexed in this step.
// When a sequence cannot get blocks, the lowest-priority, latest-arrived running sequence is
// preempted: by recompute (blocks freed, prefilled again later) or by swap (blocks copied to the
// host pool; recompute when the pool is full). No new sequence starts in a step that preempted.
// Budgets: at most max_num_batched_tokens tokens and max_num_seqs sequences per step.
// A sequence that could never fit (longer than max_model_len or than the whole KV capacity) is
// rejected when added, so no step can deadlock; FCFS within a priority level prevents starvation.
//
// The scheduler is pure bookkeeping: it owns the Sequences and drives the KvCacheManager. Each
// plan it returns is self-contained (sched/scheduler_output.h): it tracks what the runner holds
// and sends new sequences whole and running ones as changes. The engine runs the plan and then
// reports back: append_token for sampled tokens, accept_spec_tokens after a verification.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_manager.h"
#include "sched/scheduler_output.h"
#include "sched/sequence.h"

namespace vesper::sched {

enum class PreemptionMode { kRecompute, kSwap };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 2048;
  bool enable_chunked_prefill = true;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  // KV slots reserved past what a step computes, for tokens proposed later (vLLM's lookahead
  // slots); 0 without speculative decoding.
  int64_t num_lookahead_slots = 0;
  // --max-loras: distinct adapters among running sequences (0: no limit). A waiting sequence
  // whose adapter would exceed it waits, and so do the adapter sequences after it (first come,
  // first served among adapters, so none starves); sequences without an adapter go ahead.
  int64_t max_loras = 0;
};

struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_swapped = 0;
  int64_t num_preemptions = 0;  // total since start
  int64_t num_swap_outs = 0;    // preemptions by swap
  int64_t num_recomputes = 0;   // preemptions by recompute
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

  // Plans one step and commits it: blocks are allocated, num_computed_tokens advanced (by the
  // committed tokens scheduled; speculative ones are in flight until accept_spec_tokens).
  SchedulerOutput schedule();

  // A running sequence gains a sampled token.
  void append_token(SeqId id, int32_t token);

  // Speculative tokens proposed to follow the sequence's committed tokens; a later step verifies
  // them when it schedules the sequence up to its end (it may also not: they are then dropped
  // when the sequence gains a token). Replaces earlier proposals. With `tree_parents` (one per
  // token, parents first: the parent's index, -1 for the last committed token) the proposals
  // form a tree, verified in one pass with tree attention; else a chain.
  void set_spec_tokens(SeqId id, std::vector<int32_t> tokens,
                       std::vector<int32_t> tree_parents = {});
  // After a step that verified the sequence's speculative tokens: the first num_accepted become
  // committed (their K/V are computed), the rest are rolled back (their KV slots released). The
  // engine then appends the token sampled after the last accepted one (append_token).
  void accept_spec_tokens(SeqId id, int64_t num_accepted);
  // The same for a tree: `path` lists the accepted proposals from the root down (each the
  // child of the one before). Their K/V were written in the slots of their indices; the next
  // plan copies them to the slots of their positions first thing (SchedulerOutput::slot_copies).
  void accept_spec_path(SeqId id, std::span<const int32_t> path);

  // KIVI with companion storage (a draft model's cache, indexed by the same tables): `written`
  // tells how many leading positions of a sequence the companion holds rows for; compaction
  // quantizes only groups wholly before that, since a companion cannot write rows into a group
  // once it is quantized. Without it, compaction follows the residual window alone.
  void set_companion_rows(std::function<int64_t(SeqId)> written) {
    companion_rows_ = std::move(written);
  }

  // Creates `child` as a running copy of running sequence `parent`, sharing its blocks.
  void fork(SeqId parent, SeqId child);

  // Removes a sequence in any state and frees its blocks (finish and abort alike).
  void remove(SeqId id);

  const Sequence* find(SeqId id) const;
  // Calls fn(const Sequence&) for every running sequence, in id order.
  template <class Fn>
  void for_each_running(Fn&& fn) const {
    for (const auto& [id, seq] : sequences_)
      if (seq.status == SeqStatus::kRunning) fn(seq);
  }
  // Calls fn(const Sequence&) for every sequence in any state, in id order.
  template <class Fn>
  void for_each_sequence(Fn&& fn) const {
    for (const auto& [id, seq] : sequences_) fn(seq);
  }
  bool has_unfinished() const { return !sequences_.empty(); }
  SchedulerStats stats() const;
  const kv::KvCacheManager& kv() const { return kv_; }

  // Aborts (via VESPER_CHECK) if the bookkeeping is inconsistent; for tests.
  void check_invariants() const;

 private:
  Sequence& get(SeqId id);
  // Grants blocks for seq's next num_new committed and num_spec speculative tokens, preempting
  // others as needed; drops the speculative tokens (num_spec = 0) rather than preempt for them.
  // False if seq itself had to be preempted (or cannot fit even alone).
  bool allocate_or_preempt(Sequence& seq, int64_t num_new, int64_t& num_spec, SchedulerOutput& out);
  void preempt(Sequence& victim, SchedulerOutput& out);
  void schedule_tokens(Sequence& seq, int64_t num_new, int64_t num_spec, SchedulerOutput& out);
  // Fills the plan's new and cached sequence data for what it schedules, and records what the
  // runner then holds.
  void describe_for_runner(SchedulerOutput& out);
  std::vector<SeqId> ordered(SeqStatus status) const;

  // What the runner holds of a sequence: its committed tokens up to num_tokens and this table.
  struct RunnerView {
    int64_t num_tokens = 0;
    std::vector<kv::BlockId> block_table;
  };
  // Forgets the runner's copy of `id`, telling the runner in `dropped`.
  void drop_from_runner(SeqId id, std::vector<SeqId>& dropped);

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::function<int64_t(SeqId)> companion_rows_;  // set_companion_rows
  std::map<SeqId, Sequence> sequences_;
  std::unordered_map<SeqId, RunnerView> runner_;
  std::vector<SeqId> pending_drops_;  // removed since the last plan, held by the runner
  // Accepted tree paths' K/V moves, for the next plan.
  std::vector<std::pair<SeqId, SlotCopy>> pending_slot_copies_;
  SchedulerStats totals_;
};

}  // namespace vesper::sched
