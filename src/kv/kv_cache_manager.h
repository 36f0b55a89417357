// KvCacheManager: which physical blocks hold which sequence's KV, on the device and in the host
// swap space. Pure bookkeeping over two BlockPools; the engine performs the copies it asks for.
//
// The scheduler asks allocate_slots() before scheduling tokens: either every block the new
// tokens need is granted (and blocks shared with a forked sibling that would be written are
// replaced by private copies: copy-on-write), or nothing changes and the answer is false, which
// means "preempt someone". The scheduler never sees the pools' inner structure.
//
// Automatic prefix caching (when enabled): full device blocks are indexed by a hash chain over
// their tokens (kv/block_hash.h). A new sequence starts from the longest chain of cached blocks
// matching its tokens (match_prefix, then allocate_slots with the match) and computes only the
// rest. Blocks join the index once their tokens are computed (cache_full_blocks); unreferenced
// cached blocks stay valid until the pool evicts them, least recently used first.
//
// Invariant (check_invariants): each block's ref_count equals the number of block-table entries
// that point at it, device and host alike; a cached block in a sequence's table is cached under
// the hash that sequence computed for that position.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"

namespace vesper::kv {

using SeqId = int64_t;

struct BlockCopy {
  BlockId src;
  BlockId dst;
};

// One block moved between device and host: copy device->host on swap-out, host->device on swap-in.
struct SwapMapping {
  BlockId device;
  BlockId host;
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

  int64_t block_size() const { return block_size_; }
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  const BlockPool& device_pool() const { return device_; }
  const BlockPool& host_pool() const { return host_; }

  // Makes `seq`'s table cover num_tokens tokens, of which [first_written, num_tokens) are about
  // to be written. Appends to `copies` the copy-on-write copies needed. False, with nothing
  // changed, when the device has too few free blocks.
  // With `prefix` (a match_prefix result for a sequence that holds no blocks yet, and
  // first_written == prefix->num_tokens), the table starts with the matched blocks, shared.
  bool allocate_slots(SeqId seq, int64_t first_written, int64_t num_tokens, std::vector<BlockCopy>& copies,
                      const PrefixMatch* prefix = nullptr);

  // The longest chain of cached blocks holding a prefix of `tokens` under chain root `root`,
  // stopping short of the last token (which must be computed to get its logits). Empty when
  // prefix caching is off. Changes nothing.
  PrefixMatch match_prefix(std::span<const int32_t> tokens, const BlockHash& root) const;

  // Indexes seq's blocks that are full within its first num_computed tokens (the caller
  // guarantees their KV is computed, or will be by the step being planned). No-op when prefix
  // caching is off.
  void cache_full_blocks(SeqId seq, std::span<const int32_t> tokens, int64_t num_computed, const BlockHash& root);
  // Takes back cache_full_blocks for blocks past num_valid_tokens: the step that was to compute
  // them will not (the sequence was preempted while being planned).
  void uncache_blocks_from(SeqId seq, int64_t num_valid_tokens);
  // The chain hashes seq has computed for its leading full blocks (for checks and tests).
  std::span<const BlockHash> block_hashes(SeqId seq) const;

  // The child shares every block of the parent (n > 1 sampling after the prompt's prefill).
  void fork(SeqId parent, SeqId child);

  // Releases all of seq's blocks, on the device or the host. No-op for an unknown seq.
  void free(SeqId seq);

  bool has_device_blocks(SeqId seq) const { return device_tables_.count(seq) != 0; }
  bool is_swapped(SeqId seq) const { return host_tables_.count(seq) != 0; }
  const std::vector<BlockId>& block_table(SeqId seq) const;

  // Swap-out moves seq's blocks to the host pool (each block gets its own host copy, so blocks
  // shared on the device are not shared on the host); swap-in brings them back into fresh
  // device blocks. can_* say whether the target pool has room; can_swap_in's num_tokens asks for
  // room to grow the table to cover that many tokens as well (the tokens computed right after).
  bool can_swap_out(SeqId seq) const;
  std::vector<SwapMapping> swap_out(SeqId seq);
  bool can_swap_in(SeqId seq, int64_t num_tokens = 0) const;
  std::vector<SwapMapping> swap_in(SeqId seq);

  void check_invariants() const;

 private:
  int64_t block_size_;
  bool prefix_caching_;
  BlockPool device_;
  BlockPool host_;
  std::unordered_map<SeqId, std::vector<BlockId>> device_tables_;
  std::unordered_map<SeqId, std::vector<BlockId>> host_tables_;
  // Chain hashes of each sequence's leading full blocks (kept across swap-out).
  std::unordered_map<SeqId, std::vector<BlockHash>> hashes_;
};

}  // namespace vesper::kv
