// SchedulerOutput: one step's plan, self-contained (vLLM V1's SchedulerOutput with its
// NewRequestData / CachedRequestData). A runner that keeps a mirror of its sequences
// (sched/sequence_mirror.h) builds the step's batch from the plan alone: it never asks the
// scheduler anything, so a plan can run a step ahead of the scheduler, cross a thread, or be
// serialized and broadcast to other processes (serialize / deserialize).
//
// Per step, in the order a runner applies it:
//  1. `dropped`: sequences the runner forgets (finished, aborted, preempted, swapped out). A
//     dropped sequence that runs again comes back as new.
//  2. `new_sequences`: sequences the runner does not hold: every token and the whole table.
//  3. `cached_sequences`: sequences it holds: only what changed since the plan that last
//     scheduled them (tokens appended, block table entries replaced or appended, or shortened).
//  4. memory traffic before the forward pass: `group_quantizations` (KIVI), `slot_copies` (an
//  accepted tree path's K/V moved
//     to the slots of its positions), then `swap_out` (device -> host), then `swap_in`
//     (host -> device), then `block_copies` (copy-on-write, device -> device).
//  5. `scheduled`: the forward pass, one entry per sequence in batch order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_manager.h"

namespace vesper::sched {

using kv::SeqId;

// A sequence the runner does not hold.
struct NewSequenceData {
  SeqId id = 0;
  std::vector<int32_t> token_ids;  // every committed token: the prompt, then outputs so far
  std::vector<kv::BlockId> block_table;
  uint64_t adapter_id = 0;  // the sequence's adapter (Sequence::adapter_id); 0: none
  // The loaded copy its rows read (model/forward_batch.h's adapter slot; -1: none): not the
  // scheduler's business, set by whoever pins adapters for the runner (the engine) before the
  // runner sees the plan.
  int32_t adapter = -1;
  int64_t quantized_groups = 0;  // KIVI: groups stored quantized at the front of the table
};

// A block-table entry that now points at another block (copy-on-write moved it).
struct BlockTableEntry {
  int32_t index = 0;
  kv::BlockId block = 0;
};

// A sequence the runner holds: what changed since the last plan that scheduled it. The runner
// appends `new_token_ids`; then keeps the first num_blocks - new_block_ids.size() entries of its
// table, replaces `replaced_blocks` among them and appends `new_block_ids`.
struct CachedSequenceData {
  SeqId id = 0;
  std::vector<int32_t> new_token_ids;
  int64_t num_blocks = 0;
  std::vector<BlockTableEntry> replaced_blocks;
  std::vector<kv::BlockId> new_block_ids;
  int64_t quantized_groups = 0;  // KIVI: now stored quantized at the front of the table
};

// One slot's K/V (every layer) copied to another slot of the device storage.
struct SlotCopy {
  int64_t src = 0;
  int64_t dst = 0;
};

// One sequence's share of the forward pass: tokens [start, start + num_new_tokens) of its
// committed tokens followed by its speculative ones. The last num_spec_tokens of them are
// speculative (proposals, in `spec_token_ids`: not committed, verified by this step). The last
// num_logits_rows rows want logits: 0 for a prompt chunk that does not reach the end, else
// 1 + num_spec_tokens (the last committed token's row predicts the first proposal, each
// proposal's row the next). Proposals are a chain, or with `spec_tree_parents` (one per
// proposal: the parent proposal's index, -1 for the last committed token) a tree whose rows
// attend as model/forward_batch.h says; each proposal's K/V goes to the slot of position
// start + (committed tokens scheduled) + its index.
struct ScheduledSequence {
  SeqId id = 0;
  int64_t start = 0;  // num_computed_tokens before the step
  int64_t num_new_tokens = 0;
  int64_t num_spec_tokens = 0;
  int64_t num_logits_rows = 0;
  std::vector<int32_t> spec_token_ids;     // num_spec_tokens of them
  std::vector<int32_t> spec_tree_parents;  // empty (a chain) or num_spec_tokens of them

  bool samples() const { return num_logits_rows > 0; }
};

struct SchedulerOutput {
  std::vector<SeqId> dropped;
  std::vector<NewSequenceData> new_sequences;
  std::vector<CachedSequenceData> cached_sequences;
  // KIVI groups quantized into blocks (kv::GroupQuantization), before all other memory traffic:
  // the blocks their rows held may be reused by anything later in the step.
  std::vector<kv::GroupQuantization> group_quantizations;
  std::vector<SlotCopy> slot_copies;        // first of the other memory traffic
  std::vector<kv::SwapMapping> swap_out;    // device -> host, before anything else
  std::vector<kv::SwapMapping> swap_in;     // host -> device, after swap-out
  std::vector<kv::BlockCopy> block_copies;  // copy-on-write, after swaps
  std::vector<ScheduledSequence> scheduled;
  std::vector<SeqId> preempted;  // preempted this step (either mode), for statistics
  int64_t num_batched_tokens = 0;

  bool empty() const { return scheduled.empty(); }

  // A compact binary form; deserialize checks every length and value (a corrupt or truncated
  // message is an error naming the byte offset).
  std::vector<uint8_t> serialize() const;
  static Result<SchedulerOutput> deserialize(std::span<const uint8_t> bytes);
};

bool operator==(const NewSequenceData& a, const NewSequenceData& b);
bool operator==(const BlockTableEntry& a, const BlockTableEntry& b);
bool operator==(const CachedSequenceData& a, const CachedSequenceData& b);
bool operator==(const SlotCopy& a, const SlotCopy& b);
bool operator==(const ScheduledSequence& a, const ScheduledSequence& b);
bool operator==(const SchedulerOutput& a, const SchedulerOutput& b);

}  // namespace vesper::sched
