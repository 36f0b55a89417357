// SchedulerOutput: one step's plan, self-contained (vLLM V1's SchedulerOutput with its
// NewRequestData / CachedRequestData). A runner that keeps a mirror of its sequences
// (sched/sequence_mirror.h) builds the step's batch, samples and proposes from the plan alone: it
// never asks the scheduler anything, so a plan can be made while the previous step runs, cross a
// thread, or be serialized and broadcast to other processes (serialize / deserialize).
//
// The runner holds a sequence from the plan that first schedules it until a plan lists it in
// `finished`: its tokens (it appends what it samples itself, so plans carry no sampled ids), its
// sampling state (parameters, random stream, grammar cursor) and, while the sequence is resident,
// its block table. Per step, in the order a runner applies it:
//  1. `finished`: sequences the runner forgets entirely (finished, aborted).
//  2. `preempted`: sequences preempted in this step (by recompute or by swap): the runner drops
//     their tables (and, for those in `recomputed`, whatever proposers hold of their KV); they
//     come back as cached sequences with `resumed` set.
//  3. `new_sequences`: sequences the runner has never held: every token, the whole table, how
//     they sample (their SamplingParams and random seed) and their adapter's loaded copy.
//  4. `cached_sequences`: sequences it holds: only what changed since the plan that last
//     described them (table entries replaced by copy-on-write, appended, or dropped; the whole
//     table when resumed after preemption).
//  5. `forks`: n > 1 parallel samples created from a sequence whose prompt this step completes:
//     the child starts as a copy of the parent (tokens, table, parameters) with its own random
//     seed, and samples its first token from the parent's logits row.
//  6. memory traffic before the forward pass: `block_ops` (copy-on-write copies, swaps, KIVI
//     group quantizations; kv/block_op.h), one after another in the order the plan lists them.
//  7. `scheduled`: the forward pass, one entry per sequence in batch order; each entry whose step
//     reaches the sequence's last token samples (or verifies its proposals).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_manager.h"
#include "sample/sampling_params.h"
#include "sample/sampling_params_codec.h"

namespace vesper::sched {

using kv::SeqId;

// How a sequence samples: what the runner's sampling state for it starts from.
struct SamplingSetup {
  // The request's parameters (shared by its n samples; never null in a plan).
  std::shared_ptr<const sample::SamplingParams> params;
  uint64_t seed = 0;  // this sample's random stream (decided when the request was added)
};

// A sequence the runner has never held.
struct NewSequenceData {
  SeqId id = 0;
  std::vector<int32_t> token_ids;  // every committed token: the prompt, then outputs so far
  int64_t num_prompt_tokens = 0;
  std::vector<kv::BlockId> block_table;
  // The loaded copy of the sequence's adapter its rows read (model/forward_batch.h's adapter
  // slot; -1: none), bound by the scheduler when it wrote the plan (sched/adapter_binder.h).
  int32_t adapter = -1;
  int64_t quantized_groups = 0;  // KIVI: groups stored quantized at the front of the table
  SamplingSetup sampling;
};

// A block-table entry that now points at another block (copy-on-write moved it).
struct BlockTableEntry {
  int32_t index = 0;
  kv::BlockId block = 0;
};

// A sequence the runner holds: what changed since the last plan that described it. The runner
// keeps the first num_blocks - new_block_ids.size() entries of its table, replaces
// `replaced_blocks` among them and appends `new_block_ids`. `num_tokens` is how many committed
// tokens the scheduler knows of: the runner holds at least that many (it may hold more, sampled
// in a step whose results the scheduler has not read yet).
struct CachedSequenceData {
  SeqId id = 0;
  bool resumed = false;  // back after preemption: the table is new_block_ids alone
  int64_t num_tokens = 0;
  int64_t num_blocks = 0;
  std::vector<BlockTableEntry> replaced_blocks;
  std::vector<kv::BlockId> new_block_ids;
  int64_t quantized_groups = 0;  // KIVI: now stored quantized at the front of the table
  int32_t adapter = -1;          // the adapter's loaded copy (it may change on resume)
};

// A parallel sample created this step from `parent`, whose prompt the step completes.
struct ForkData {
  SeqId parent = 0;
  SeqId child = 0;
  uint64_t seed = 0;  // the child's random stream
};

// One sequence's share of the forward pass: tokens [start, start + num_new_tokens) of its
// committed tokens followed by its speculative ones. The last num_spec_tokens of them are
// speculative (proposals, in `spec_token_ids`: not committed, verified by this step). The last
// num_logits_rows rows want logits: 0 for a prompt chunk that does not reach the end, else
// 1 + num_spec_tokens (the last committed token's row predicts the first proposal, each
// proposal's row the next). Proposals are a chain, or with `spec_tree_parents` (one per
// proposal: the parent proposal's index, -1 for the last committed token) a tree whose rows
// attend as model/forward_batch.h says; each proposal's K/V goes to the slot of position
// start + (committed tokens scheduled) + its index (the runner moves an accepted path's K/V to
// the slots of its positions right after verifying it).
//
// Multi-step (num_steps > 1, SchedulerConfig::num_scheduler_steps): a decode runs num_steps
// passes back to back; each samples a token, which the next pass computes at the next position
// (the runner feeds its own samples; the table covers positions start .. start + num_steps - 1).
// The sequence ends early at a token that stops it.
struct ScheduledSequence {
  SeqId id = 0;
  int64_t start = 0;  // num_computed_tokens before the step
  int64_t num_new_tokens = 0;
  int64_t num_spec_tokens = 0;
  int64_t num_logits_rows = 0;
  std::vector<int32_t> spec_token_ids;     // num_spec_tokens of them
  std::vector<int32_t> spec_tree_parents;  // empty (a chain) or num_spec_tokens of them
  int64_t num_steps = 1;                   // passes (and tokens sampled) when it samples

  bool samples() const { return num_logits_rows > 0; }
};

// A waiting or swapped sequence that could not be admitted for a reason that will not go away
// (its adapter's file no longer reads): the scheduler dropped it; its request must end.
struct FailedSequence {
  SeqId id = 0;
  uint64_t adapter_id = 0;  // the adapter registration it held (the engine lets it go)
  std::string message;
};

struct SchedulerOutput {
  std::vector<SeqId> finished;
  std::vector<SeqId> preempted;   // preempted this step (either mode)
  std::vector<SeqId> recomputed;  // those of them preempted by recompute (their KV is gone)
  std::vector<NewSequenceData> new_sequences;
  std::vector<CachedSequenceData> cached_sequences;
  std::vector<ForkData> forks;
  // The step's block operations, in the order the scheduler decided them, which is the order
  // they run in (kv/block_op.h says why that order is always valid).
  std::vector<kv::BlockOp> block_ops;
  std::vector<ScheduledSequence> scheduled;
  int64_t num_batched_tokens = 0;
  // Sequences running or waiting after this plan (what --speculative-disable-by-batch-size
  // compares), and the scheduler's failures (not for the runner).
  int64_t num_running_or_waiting = 0;
  std::vector<FailedSequence> failed;

  bool empty() const { return scheduled.empty(); }

  // A compact binary form; deserialize checks every length and what can be checked without the
  // runner's state (a corrupt or truncated message is an error naming the byte offset or the
  // fault; block ids against the storage and token ids against the vocabulary are the mirror's
  // to check, SequenceMirror::set_bounds). A grammar in a new sequence's parameters is compiled
  // with `compile` (an error without one, or for a grammar the matcher cannot run).
  std::vector<uint8_t> serialize() const;
  static Result<SchedulerOutput> deserialize(std::span<const uint8_t> bytes,
                                             const sample::GrammarCompiler& compile = {});
};

bool operator==(const SamplingSetup& a, const SamplingSetup& b);
bool operator==(const NewSequenceData& a, const NewSequenceData& b);
bool operator==(const BlockTableEntry& a, const BlockTableEntry& b);
bool operator==(const CachedSequenceData& a, const CachedSequenceData& b);
bool operator==(const ForkData& a, const ForkData& b);
bool operator==(const ScheduledSequence& a, const ScheduledSequence& b);
bool operator==(const FailedSequence& a, const FailedSequence& b);
bool operator==(const SchedulerOutput& a, const SchedulerOutput& b);

}  // namespace vesper::sched
