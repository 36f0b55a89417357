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
// and sends new sequences whole (with how they sample) and resident ones as changes; it binds
// adapters to loaded copies as it writes them (sched/adapter_binder.h) and forks n > 1 samples in
// the step that completes their prompt. After the runner has run a plan, update() takes what it
// returned (sched/runner_output.h): sampled tokens, verified proposals, token-level finishes and
// the next step's proposals.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_manager.h"
#include "sched/adapter_binder.h"
#include "sched/runner_output.h"
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
  // KIVI with a draft model: a group is quantized only once the draft's cache holds its rows
  // (Sequence::companion_rows, from the runner's outputs): the draft cannot catch up into a
  // quantized group.
  bool compaction_waits_for_companion = false;
  // KV sparsity (backend/kv_sparsity.h), from each sequence's prompt end (a request with
  // SamplingParams::kv_dense has none). Sinks + window (--kv-sink-tokens / --kv-window): the
  // blocks between a sequence's sinks and the window of its next query are freed as it decodes.
  // Quest (--kv-sparsity quest): nothing is freed; only prompt blocks enter the prefix cache.
  backend::KvSparsity kv_sparsity;
  // Plans the runner may be running or holding when the next one is made: 1 when each plan runs
  // before the next is made, 2 with async scheduling. An adapter copy is unpinned only once no
  // such plan reads it.
  int64_t max_plans_in_flight = 1;
  // --num-scheduler-steps N: a plan whose every entry decodes (one token each past its prompt: no
  // prompt work, no proposals, no forks) runs N passes at once (ScheduledSequence::num_steps),
  // each sequence as far as its max_tokens allow and KV slots are free.
  int64_t num_scheduler_steps = 1;
  // Pipeline parallelism's virtual engines (vLLM's): with V > 1 each sequence belongs to one of V
  // sets (the one with the fewest sequences when it arrives; its forks to its own), and successive
  // schedule() calls take the sets in turn, each scheduling, admitting and preempting only its
  // own. So the V - 1 plans before a plan, which a pipeline may still be computing, never
  // schedule its sequences. Each plan has the whole token and sequence budgets.
  int64_t virtual_engines = 1;
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
  // Where adapters are pinned (null: none are; a sequence with an adapter then cannot run).
  void set_adapter_binder(AdapterBinder* binder) { binder_ = binder; }
  // The last schedule() left a sequence waiting for its adapter's copy to be read.
  bool waited_on_adapter() const { return waited_on_adapter_; }

  // Adds a waiting sequence. Errors (nothing added) when it could never be scheduled: prompt
  // or max_total_tokens over max_model_len, more blocks than the cache has, or, with chunked
  // prefill off, a prompt or max_total_tokens over the token budget (a sequence preempted by
  // recompute must be prefilled again in one step).
  Status add(Sequence seq);

  // Plans one step and commits it: blocks are allocated, num_computed_tokens advanced (by the
  // committed tokens scheduled; speculative ones are in flight until update), adapters pinned,
  // forks made.
  SchedulerOutput schedule();

  // What the runner returned for `plan` (the last plan schedule() made, or with async scheduling
  // the one before it: update comes after the next plan is made): each sampled
  // sequence's tokens are committed (kept proposals become computed, the rest of their KV slots
  // go back), a sequence whose last token ends it is removed, and the proposals become the
  // sequence's speculative tokens for a later step. Sequences removed since the plan was made
  // (aborted, finished by a stop string) are skipped.
  void update(const SchedulerOutput& plan, const ModelRunnerOutput& output);

  // Removes a sequence in any state and frees its blocks (finish and abort alike). With
  // `num_valid_tokens`, its blocks past that many tokens leave the prefix cache first (tokens
  // after a stop string that ended the sequence late: nothing of them is kept).
  void remove(SeqId id, int64_t num_valid_tokens = -1);

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
  // Whether the sequence's adapter copy is loaded (else its read goes on off the engine thread).
  bool adapter_ready(const Sequence& seq);
  // Pins the adapter of a sequence about to become resident in the runner. False (and the
  // sequence dropped, reported in out.failed) when its copy cannot be loaded.
  bool bind_adapter(Sequence& seq, SchedulerOutput& out);
  // Forks the n > 1 samples of the plan's sequences whose prompt it completes.
  void fork_samples(SchedulerOutput& out);
  // A plan of decodes alone runs num_scheduler_steps passes: each entry's KV slots and
  // placeholders for its further tokens.
  void extend_to_multi_step(SchedulerOutput& out);
  // Fills the plan's new and cached sequence data for what it schedules (and for resident
  // sequences whose tables changed since the runner last saw them), and records what the runner
  // then holds.
  void describe_for_runner(SchedulerOutput& out);
  std::vector<SeqId> ordered(SeqStatus status) const;
  // The runner stops reading `id`'s KV (preempted): its table and adapter pin go.
  void release_from_runner(SeqId id);
  // The KV sparsity `seq` reads with (none for a request that opted out).
  backend::KvSparsity sparsity_of(const Sequence& seq) const;
  // The most tokens a step may compute of `seq` from position `start`: with a window (and
  // chunked prefill), a chunk stops at the prompt's end, and a chunk of its output (recomputed
  // after preemption) spans at most the window, so a sequence never holds more than its prompt's
  // blocks or its sinks' and two windows' (what add() admits it by). Unlimited otherwise.
  int64_t chunk_limit(const Sequence& seq, int64_t start) const;
  // The runner forgets `id` (finished, aborted): told in the next plan's `finished`.
  void forget_in_runner(SeqId id);
  // Unpins the adapter slots no plan still in flight reads.
  void release_unpins();
  // Drops a sequence that can never be admitted (its adapter no longer loads): its blocks go, the
  // runner forgets it, the plan reports it in `failed`.
  void fail(Sequence& seq, std::string message, SchedulerOutput& out);
  // Commits `num_accepted` of the sequence's in-flight proposals and appends `tokens` (the kept
  // proposals' ids, then the token drawn after them). `finishing`: its last token ends it (no more
  // blocks enter the prefix cache).
  void commit(Sequence& seq, int64_t num_accepted, std::span<const int32_t> tokens, bool finishing);
  // Speculative tokens proposed to follow the sequence's committed tokens (tree_parents empty:
  // a chain), capped at what it may still grow by.
  void set_spec_tokens(Sequence& seq, std::span<const int32_t> tokens,
                       std::span<const int32_t> tree_parents);

  // What the runner holds of a sequence: whether it is resident (its table), the committed tokens
  // the scheduler told it of, and the table as last described.
  struct RunnerView {
    bool resident = false;
    int64_t num_tokens = 0;
    std::vector<kv::BlockId> block_table;
  };

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  AdapterBinder* binder_ = nullptr;
  bool waited_on_adapter_ = false;
  std::map<SeqId, Sequence> sequences_;
  std::unordered_map<SeqId, RunnerView> runner_;
  std::vector<SeqId> pending_finished_;       // forgotten since the last plan
  std::unordered_set<SeqId> tables_changed_;  // resident, table changed outside a plan
  // Adapter slots the runner stopped reading, each with the schedule() call it was released in
  // or after (epoch_ then): released once no plan in flight can read them.
  std::deque<std::pair<int64_t, int32_t>> pending_unpins_;
  int64_t epoch_ = 0;  // schedule() calls so far
  // Whether the schedule() call under way is `seq`'s virtual engine's turn.
  bool scheduling_now(const Sequence& seq) const {
    return config_.virtual_engines <= 1 || seq.virtual_engine == epoch_ % config_.virtual_engines;
  }
  SchedulerStats totals_;
};

}  // namespace vesper::sched
