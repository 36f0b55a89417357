// BlockPool: the physical KV blocks of one device (or of the host swap space) as bookkeeping:
// reference counts and a free list. It never touches tensors.
//
// Invariants: every block is either free (ref_count 0, in the free list exactly once) or in use
// (ref_count > 0, not in the free list). num_free() + blocks in use == num_blocks().
// Allocation takes blocks from the front of the free list; freed blocks go to the back, so the
// block freed longest ago is reused first (the order prefix caching's LRU eviction builds on).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace vesper::kv {

using BlockId = int32_t;

class BlockPool {
 public:
  explicit BlockPool(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks() - num_free(); }
  int32_t ref_count(BlockId id) const { return ref_counts_[id]; }

  // Takes `n` free blocks with ref_count 1, or nothing when fewer than n are free.
  std::optional<std::vector<BlockId>> allocate(int64_t n);
  // Adds a reference to a block in use (sharing between sequences).
  void add_ref(BlockId id);
  // Drops one reference; a block whose count reaches zero returns to the free list.
  void release(BlockId id);

  // Checks the invariants above; aborts with details when broken (tests call it every step).
  void check_invariants() const;

 private:
  std::vector<int32_t> ref_counts_;
  std::deque<BlockId> free_;
};

}  // namespace vesper::kv
