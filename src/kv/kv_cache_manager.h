// KvCacheManager: which physical blocks hold which sequence's KV, on the device and in the host
// swap space. Pure bookkeeping over two BlockPools; the engine performs the copies it asks for.
//
// The contract with the scheduler (vLLM V1's allocate_slots):
//  - allocate_slots(seq, num_computed, num_new, num_lookahead) is asked before a step schedules
//    num_new tokens of seq (speculative ones included). The answer is an opaque KvAllocation,
//    or nothing, which means "preempt someone" (and then nothing changed). A granted
//    allocation covers num_computed + num_new + num_lookahead tokens; the blocks holding the
//    num_new tokens about to be written are private to seq (a block shared with a forked sibling
//    is replaced by a copy: the allocation lists the copies the step must run first). Lookahead
//    slots are room for tokens proposed later (speculative decoding); they are not written now.
//  - truncate(seq, num_tokens) takes back what a step did not keep (rejected speculative
//    tokens, unused lookahead): the blocks past num_tokens are released and leave the prefix
//    cache. Stale K/V may stay in the last kept block past num_tokens: every position is written
//    again before anything reads it (the forward pass writes a step's K/V before its attention
//    reads, model/model.h).
//  - Preemption goes through free() (with the step's planned ops: copies planned into the
//    victim's blocks are dropped) or swap_out(). The scheduler never sees the pools' inner
//    structure or rewrites mappings itself.
//
// Automatic prefix caching (when enabled): full device blocks are indexed by a hash chain over
// their tokens (kv/block_hash.h). A new sequence starts from the longest chain of cached blocks
// matching its tokens (match_prefix, then allocate_slots with the match) and computes only the
// rest. Blocks join the index once their tokens are committed, that is computed (or about to be,
// in the step being planned) and not speculative (cache_full_blocks is given the committed
// count); unreferenced cached blocks stay valid until the pool evicts them, least recently used
// first.
//
// Invariant (check_invariants): each block's ref_count equals the number of block-table entries
// that point at it, device and host alike; a cached block in a sequence's table is cached under
// the hash that sequence computed for that position.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/kv_sparsity.h"
#include "backend/kv_table_layout.h"
#include "kv/block_op.h"
#include "kv/block_pool.h"

namespace vesper::kv {

using SeqId = int64_t;

// What allocate_slots granted. The scheduler learns only the copy-on-write copies it must put in
// the step's plan (to run before the forward pass); the blocks themselves stay the manager's.
class KvAllocation {
 public:
  const std::vector<BlockCopy>& copies() const { return copies_; }

 private:
  friend class KvCacheManager;
  std::vector<BlockCopy> copies_;
};

// The cached blocks a new sequence can start from: blocks[i] holds tokens [i*bs, (i+1)*bs).
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;  // chain hash of each matched block
  int64_t num_tokens = 0;         // blocks.size() * block_size
};

class KvCacheManager {
 public:
  KvCacheManager(int64_t num_device_blocks, int64_t num_host_blocks, int64_t block_size,
                 bool enable_prefix_caching = false);

  bool prefix_caching_enabled() const { return prefix_caching_; }

  // KIVI tables (backend/kv_cache_spec.h): a block is a group of block_size tokens; a sequence's
  // table holds quantized_groups(seq) quantized groups first, one block each, then every later
  // group's residual rows: rows_per_block rows a block, so ceil(block_size / rows_per_block) blocks
  // per group (allocated a whole group at a time).
  // compact() turns the groups a query at the sequence's next position reads quantized (whole
  // groups older than residual_length tokens) into quantized blocks. Call before any sequence
  // holds blocks. With prefix caching, each full group's residual blocks are cached (under
  // per-block hashes derived from the group's chain hash) until compaction or eviction: a hit is
  // a run of residual groups, which the next compact() of the sequence quantizes.
  void enable_kivi(int64_t rows_per_block, int64_t residual_length);
  bool kivi() const { return kivi_; }
  // Rows a block holds as written (block_size, or KIVI's residual rows a block).
  int64_t rows_per_block() const { return layout_.rows_per_block; }
  int64_t quantized_groups(SeqId seq) const;
  // How seq's table maps positions to entries and slots (its quantized groups included).
  backend::KvTableLayout layout_of(SeqId seq) const {
    return layout_.with_quantized(quantized_groups(seq));
  }
  // Quantizes seq's residual groups that a query at position num_computed reads quantized, as
  // free blocks allow (one each; a group left as residual rows is quantized by attention on the
  // fly, with the same result), and only groups wholly before `written` (the rows every storage
  // indexed by the table holds: a draft model's may lag). Returns the quantizations the step
  // must run first.
  std::vector<GroupQuantization> compact(SeqId seq, int64_t num_computed,
                                         int64_t written = std::numeric_limits<int64_t>::max());
  // Brings seq's table into the shape its layout wants before a step that computes from
  // position num_computed, appending the block ops the step must run first to `ops`: KIVI
  // compacts (above, with `written`); with `window` on (the sequence's sinks + window,
  // backend::KvSparsity), the blocks that no query from num_computed on reads are freed,
  // their entries left as kNoBlock. Whether the table changed.
  bool prepare_step(SeqId seq, int64_t num_computed, int64_t written,
                    const backend::KvSparsity& window, std::vector<BlockOp>& ops);
  // Blocks seq holds (its table's entries less its freed ones).
  int64_t num_live_blocks(SeqId seq) const;
  // Table entries seq needs to cover num_tokens tokens (blocks_for(num_tokens) without KIVI).
  int64_t entries_for(SeqId seq, int64_t num_tokens) const;

  int64_t block_size() const { return layout_.block_size; }
  // Blocks that cover num_tokens tokens of any sequence (with KIVI, as residual rows: the most a
  // sequence can hold at once).
  int64_t blocks_for(int64_t num_tokens) const {
    return (num_tokens + block_size() - 1) / block_size() * layout_.blocks_per_group;
  }
  int64_t num_device_blocks() const { return device_.num_blocks(); }
  // Device blocks allocate_slots can still hand out (free or evictable).
  int64_t num_free_device_blocks() const { return device_.num_free(); }
  // The pools, for statistics and tests.
  const BlockPool& device_pool() const { return device_; }
  const BlockPool& host_pool() const { return host_; }

  // Grows `seq`'s table to cover num_computed + num_new + num_lookahead tokens and makes the
  // blocks of tokens [num_computed, num_computed + num_new) private (copy-on-write). Nothing,
  // with nothing changed, when the device has too few free blocks.
  // With `prefix` (a match_prefix result for a sequence that holds no blocks yet, and
  // num_computed == prefix->num_tokens), the table starts with the matched blocks, shared.
  std::optional<KvAllocation> allocate_slots(SeqId seq, int64_t num_computed, int64_t num_new,
                                             int64_t num_lookahead = 0,
                                             const PrefixMatch* prefix = nullptr);

  // Keeps the blocks holding seq's first num_tokens tokens and releases the rest; blocks past
  // num_tokens leave the prefix cache (their tokens were not committed). No-op for an unknown seq.
  void truncate(SeqId seq, int64_t num_tokens);

  // The longest chain of cached blocks holding a prefix of `tokens` under chain root `root`,
  // stopping short of the last token (which must be computed to get its logits). Empty when
  // prefix caching is off. Changes nothing.
  PrefixMatch match_prefix(std::span<const int32_t> tokens, const BlockHash& root) const;

  // Indexes seq's blocks that are full within its first num_computed tokens (the caller
  // guarantees their KV is computed, or will be by the step being planned). No-op when prefix
  // caching is off.
  void cache_full_blocks(SeqId seq, std::span<const int32_t> tokens, int64_t num_computed,
                         const BlockHash& root);
  // Takes back cache_full_blocks for blocks past num_valid_tokens: the step that was to compute
  // them will not (the sequence was preempted while being planned).
  void uncache_blocks_from(SeqId seq, int64_t num_valid_tokens);
  // The chain hashes seq has computed for its leading full blocks (for checks and tests).
  std::span<const BlockHash> block_hashes(SeqId seq) const;

  // The child shares every block of the parent (n > 1 sampling after the prompt's prefill).
  void fork(SeqId parent, SeqId child);

  // Releases all of seq's blocks, on the device or the host. No-op for an unknown seq. With
  // `planned_ops` (the block ops planned so far in the step being built, kv/block_op.h), the
  // copies into seq's blocks are dropped: seq gives those blocks up before the step runs.
  void free(SeqId seq, std::vector<BlockOp>* planned_ops = nullptr);

  bool has_device_blocks(SeqId seq) const { return device_tables_.count(seq) != 0; }
  bool is_swapped(SeqId seq) const { return host_tables_.count(seq) != 0; }
  const std::vector<BlockId>& block_table(SeqId seq) const;
  // The slot (block * rows per block + row) of the row of position `pos` of seq, as written:
  // block_size rows a block, or with KIVI rows_per_block residual rows a block (the position must
  // lie past the sequence's quantized groups).
  int64_t slot(SeqId seq, int64_t pos) const;

  // Swap-out moves seq's blocks to the host pool (each block gets its own host copy, so blocks
  // shared on the device are not shared on the host); swap-in brings them back into fresh
  // device blocks. can_* say whether the target pool has room; can_swap_in's num_tokens asks for
  // room to grow the table to cover that many tokens as well (the tokens computed right after).
  // Copies planned into seq's blocks earlier in the step run before its swap-out reads them (a
  // plan's ops run in the order they were decided).
  bool can_swap_out(SeqId seq) const;
  std::vector<SwapMapping> swap_out(SeqId seq);
  bool can_swap_in(SeqId seq, int64_t num_tokens = 0) const;
  std::vector<SwapMapping> swap_in(SeqId seq);

  void check_invariants() const;
  // Checks seq's cached blocks against its tokens: each cached block in its table holds exactly
  // the tokens at that position, and only committed positions (< num_committed) are hashed.
  void check_sequence(SeqId seq, std::span<const int32_t> tokens, int64_t num_committed) const;

 private:
  // Removes the planned copies into seq's device blocks from `planned`.
  void drop_copies_into(SeqId seq, std::vector<BlockOp>& planned) const;

  // The groups (block positions) seq's table holds.
  int64_t groups_in(SeqId seq, const std::vector<BlockId>& table) const {
    return layout_of(seq).group_of_entry(static_cast<int64_t>(table.size()) +
                                         layout_.blocks_per_group - 1);
  }
  // Whether `block` is cached as block k of the group (KIVI) or the block (k = 0) with chain hash
  // group_hash.
  bool cached_as(BlockId block, const BlockHash& group_hash, int64_t k) const;

  // The geometry every table shares (quantized_groups 0; layout_of adds a sequence's).
  backend::KvTableLayout layout_;
  bool prefix_caching_;
  bool kivi_ = false;
  int64_t kivi_residual_ = 0;
  // KIVI: each sequence's quantized groups (kept across swap-out).
  std::unordered_map<SeqId, int64_t> quantized_;
  BlockPool device_;
  BlockPool host_;
  std::unordered_map<SeqId, std::vector<BlockId>> device_tables_;
  std::unordered_map<SeqId, std::vector<BlockId>> host_tables_;
  // Chain hashes of each sequence's leading full blocks (kept across swap-out).
  std::unordered_map<SeqId, std::vector<BlockHash>> hashes_;
};

}  // namespace vesper::kv
