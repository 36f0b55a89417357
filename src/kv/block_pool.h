// BlockPool: the physical KV blocks of one device (or of the host swap space) as bookkeeping:
// reference counts, a free list, and the prefix cache's index of full blocks by content. It
// never touches tensors.
//
// Every block is in exactly one of three states:
//  - in use: ref_count > 0 (it may also be cached: its content is indexed by hash);
//  - free: ref_count 0, holding nothing anyone can find, in the free list;
//  - evictable: ref_count 0 but cached: its KV stays valid for a later request with the same
//    prefix, in the eviction list ordered least recently released first.
// num_free() counts both kinds of unreferenced blocks: all can be allocated. Allocation takes
// free blocks first and only then evicts the least recently released cached block. Free blocks
// are reused most recently freed first (freed blocks go to the front of the free list, where
// allocation takes them): their memory is likely still cached and already backed by pages, while
// a block never used yet costs page faults (the KV buffer is not touched in advance). KIVI's
// compaction frees a group's residual blocks every few steps; taken from the back, those would
// walk the whole pool through fresh pages.
// A caller releasing a sequence's blocks last-to-first therefore gets leaves evicted before
// their parents.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_hash.h"

namespace vesper::kv {

using BlockId = int32_t;
// A block-table entry whose block was freed while later entries stay (the positions between a
// sequence's attention sinks and its window): it holds no block and is never read.
inline constexpr BlockId kNoBlock = -1;

class BlockPool {
 public:
  // block_size: tokens per block, the length of the token list cached blocks keep.
  explicit BlockPool(int64_t num_blocks, int64_t block_size = 1);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  // Blocks allocate() can hand out: free plus evictable.
  int64_t num_free() const { return static_cast<int64_t>(free_.size()) + num_evictable_; }
  int64_t num_used() const { return num_blocks() - num_free(); }
  // Unreferenced blocks that still hold cached KV.
  int64_t num_evictable() const { return num_evictable_; }
  // Blocks indexed by the prefix cache, in use or not.
  int64_t num_cached() const { return static_cast<int64_t>(by_hash_.size()); }
  // Cached blocks evicted (handed out for new content) since start.
  int64_t num_evictions() const { return num_evictions_; }
  int32_t ref_count(BlockId id) const { return ref_counts_[id]; }

  // Takes `n` blocks with ref_count 1 (free ones first, then evicting cached ones), or nothing
  // when fewer than n are free or evictable.
  std::optional<std::vector<BlockId>> allocate(int64_t n);
  // Adds a reference to a block in use (sharing between sequences) or to an evictable block
  // (a prefix-cache hit), which leaves the eviction list.
  void add_ref(BlockId id);
  // Drops one reference. A block whose count reaches zero goes to the back of the eviction list
  // when cached, else to the front of the free list.
  void release(BlockId id);

  // Prefix cache. A cached block's KV must be fully computed for its tokens: the caller
  // registers a block only once it holds (or, within the step being planned, will hold) them.
  //
  // The block cached under `hash`, if any.
  std::optional<BlockId> lookup(const BlockHash& hash) const;
  // Indexes block `id` (in use) as holding `tokens` (block_size of them) after the block whose
  // hash is `parent`; `hash` must be chain_block_hash(parent, tokens). False, with nothing
  // changed, when another block is already cached under this hash (identical content computed
  // twice; this one stays uncached) or `id` is already cached.
  bool register_block(BlockId id, const BlockHash& parent, const BlockHash& hash,
                      std::span<const int32_t> tokens);
  // Drops block `id` from the index (its content is about to become invalid). No-op when it is
  // not cached.
  void unregister_block(BlockId id);
  // The hash and tokens of a cached block (nullptr / empty when not cached).
  const BlockHash* hash_of(BlockId id) const;
  std::span<const int32_t> tokens_of(BlockId id) const;
  // Forgets every cached block (in-use blocks stay allocated, just no longer findable).
  void clear_cache();

  // Checks the invariants above and that every cached block's hash is the chain hash of its
  // parent hash and tokens; aborts with details when broken (tests call it every step).
  void check_invariants() const;

 private:
  struct CacheEntry {
    BlockHash hash;
    BlockHash parent;
    std::vector<int32_t> tokens;
    // check_invariants recomputes an entry's hash once (entries never change afterwards), so
    // that calling it every step stays cheap.
    mutable bool hash_verified = false;
  };
  static constexpr BlockId kNone = -1;
  void unlink_evictable(BlockId id);
  void append_evictable(BlockId id);
  BlockId evict_one();

  int64_t block_size_;
  std::vector<int32_t> ref_counts_;
  std::deque<BlockId> free_;
  // Eviction list: an intrusive doubly linked list over block ids, so a hit leaves it in O(1).
  std::vector<BlockId> prev_, next_;
  BlockId head_ = kNone, tail_ = kNone;
  int64_t num_evictable_ = 0;
  int64_t num_evictions_ = 0;
  std::vector<std::optional<CacheEntry>> entries_;  // per block
  std::unordered_map<BlockHash, BlockId, BlockHashHasher> by_hash_;
};

}  // namespace vesper::kv
