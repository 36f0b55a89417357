#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace vesper::kv {

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size)
    : block_size_(block_size),
      ref_counts_(num_blocks, 0),
      prev_(num_blocks, kNone),
      next_(num_blocks, kNone),
      entries_(num_blocks) {
  VESPER_CHECK(block_size > 0, "block size %lld", static_cast<long long>(block_size));
  for (int64_t i = 0; i < num_blocks; ++i) free_.push_back(static_cast<BlockId>(i));
}

void BlockPool::unlink_evictable(BlockId id) {
  const BlockId p = prev_[id], n = next_[id];
  (p == kNone ? head_ : next_[p]) = n;
  (n == kNone ? tail_ : prev_[n]) = p;
  prev_[id] = next_[id] = kNone;
  --num_evictable_;
}

void BlockPool::append_evictable(BlockId id) {
  prev_[id] = tail_;
  next_[id] = kNone;
  (tail_ == kNone ? head_ : next_[tail_]) = id;
  tail_ = id;
  ++num_evictable_;
}

BlockId BlockPool::evict_one() {
  const BlockId id = head_;
  VESPER_CHECK(id != kNone, "eviction from an empty eviction list");
  unlink_evictable(id);
  by_hash_.erase(entries_[id]->hash);
  entries_[id].reset();
  ++num_evictions_;
  return id;
}

std::optional<std::vector<BlockId>> BlockPool::allocate(int64_t n) {
  if (n > num_free()) return std::nullopt;
  std::vector<BlockId> ids;
  ids.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    BlockId id;
    if (!free_.empty()) {
      id = free_.front();
      free_.pop_front();
    } else {
      id = evict_one();
    }
    VESPER_CHECK(ref_counts_[id] == 0, "free block %d has ref_count %d", id, ref_counts_[id]);
    ref_counts_[id] = 1;
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::add_ref(BlockId id) {
  VESPER_CHECK(id >= 0 && id < num_blocks(), "add_ref on block %d, which does not exist", id);
  if (ref_counts_[id] == 0) {
    // Only a cached block can be revived: a plain free block holds nothing anyone asked for.
    VESPER_CHECK(entries_[id].has_value(), "add_ref on block %d, which is free and not cached", id);
    unlink_evictable(id);
  }
  ++ref_counts_[id];
}

void BlockPool::release(BlockId id) {
  VESPER_CHECK(id >= 0 && id < num_blocks() && ref_counts_[id] > 0, "release of block %d (ref %d)",
               id, id >= 0 && id < num_blocks() ? ref_counts_[id] : -1);
  if (--ref_counts_[id] != 0) return;
  if (entries_[id].has_value())
    append_evictable(id);
  else
    free_.push_front(id);
}

std::optional<BlockId> BlockPool::lookup(const BlockHash& hash) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::register_block(BlockId id, const BlockHash& parent, const BlockHash& hash,
                               std::span<const int32_t> tokens) {
  VESPER_CHECK(id >= 0 && id < num_blocks() && ref_counts_[id] > 0,
               "register_block of block %d not in use", id);
  VESPER_CHECK(static_cast<int64_t>(tokens.size()) == block_size_,
               "register_block with %zu tokens, block size %lld", tokens.size(),
               static_cast<long long>(block_size_));
  if (entries_[id].has_value() || by_hash_.count(hash) != 0) return false;
  entries_[id] = CacheEntry{hash, parent, std::vector<int32_t>(tokens.begin(), tokens.end())};
  by_hash_.emplace(hash, id);
  return true;
}

void BlockPool::unregister_block(BlockId id) {
  if (!entries_[id].has_value()) return;
  by_hash_.erase(entries_[id]->hash);
  entries_[id].reset();
  if (ref_counts_[id] == 0) {
    // An evictable block that is no longer cached is simply free.
    unlink_evictable(id);
    free_.push_front(id);
  }
}

const BlockHash* BlockPool::hash_of(BlockId id) const {
  return entries_[id].has_value() ? &entries_[id]->hash : nullptr;
}

std::span<const int32_t> BlockPool::tokens_of(BlockId id) const {
  if (!entries_[id].has_value()) return {};
  return entries_[id]->tokens;
}

void BlockPool::clear_cache() {
  for (BlockId id = 0; id < num_blocks(); ++id) unregister_block(id);
}

void BlockPool::check_invariants() const {
  std::vector<int> in_free(ref_counts_.size(), 0), in_lru(ref_counts_.size(), 0);
  for (BlockId id : free_) {
    VESPER_CHECK(id >= 0 && id < num_blocks(), "free list holds invalid block %d", id);
    ++in_free[id];
  }
  int64_t lru_len = 0;
  for (BlockId id = head_, prev = kNone; id != kNone; prev = id, id = next_[id]) {
    VESPER_CHECK(id >= 0 && id < num_blocks(), "eviction list holds invalid block %d", id);
    VESPER_CHECK(prev_[id] == prev, "eviction list: block %d has a broken back link", id);
    VESPER_CHECK(++in_lru[id] == 1, "eviction list holds block %d twice", id);
    VESPER_CHECK(++lru_len <= num_blocks(), "eviction list has a cycle");
  }
  VESPER_CHECK(lru_len == num_evictable_, "eviction list has %lld blocks, counted %lld",
               static_cast<long long>(lru_len), static_cast<long long>(num_evictable_));
  int64_t used = 0, plain_free = 0, evictable = 0;
  for (size_t i = 0; i < ref_counts_.size(); ++i) {
    const bool cached = entries_[i].has_value();
    VESPER_CHECK(ref_counts_[i] >= 0, "block %zu has negative ref_count", i);
    if (ref_counts_[i] > 0) {
      ++used;
      VESPER_CHECK(in_free[i] == 0 && in_lru[i] == 0,
                   "block %zu is referenced (%d) but listed as free", i, ref_counts_[i]);
    } else if (cached) {
      ++evictable;
      VESPER_CHECK(in_lru[i] == 1 && in_free[i] == 0,
                   "cached unreferenced block %zu is not (only) in the eviction list", i);
    } else {
      ++plain_free;
      VESPER_CHECK(in_free[i] == 1 && in_lru[i] == 0,
                   "unreferenced block %zu is in the free list %d times", i, in_free[i]);
    }
    if (cached) {
      const CacheEntry& e = *entries_[i];
      VESPER_CHECK(static_cast<int64_t>(e.tokens.size()) == block_size_,
                   "cached block %zu holds %zu tokens", i, e.tokens.size());
      if (!e.hash_verified) {
        VESPER_CHECK(chain_block_hash(e.parent, e.tokens) == e.hash,
                     "cached block %zu: hash does not match its tokens", i);
        e.hash_verified = true;
      }
      auto it = by_hash_.find(e.hash);
      VESPER_CHECK(it != by_hash_.end() && it->second == static_cast<BlockId>(i),
                   "cached block %zu is not the block indexed under its hash", i);
    }
  }
  for (const auto& [hash, id] : by_hash_)
    VESPER_CHECK(entries_[id].has_value() && entries_[id]->hash == hash,
                 "hash index points at block %d, which is not cached under it", id);
  VESPER_CHECK(used + plain_free + evictable == num_blocks(),
               "used %lld + free %lld + cached %lld != %lld blocks", static_cast<long long>(used),
               static_cast<long long>(plain_free), static_cast<long long>(evictable),
               static_cast<long long>(num_blocks()));
}

}  // namespace vesper::kv
