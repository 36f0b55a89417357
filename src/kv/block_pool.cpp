#include "kv/block_pool.h"

#include "core/check.h"

namespace vesper::kv {

BlockPool::BlockPool(int64_t num_blocks) : ref_counts_(num_blocks, 0) {
  for (int64_t i = 0; i < num_blocks; ++i) free_.push_back(static_cast<BlockId>(i));
}

std::optional<std::vector<BlockId>> BlockPool::allocate(int64_t n) {
  if (n > num_free()) return std::nullopt;
  std::vector<BlockId> ids;
  ids.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const BlockId id = free_.front();
    free_.pop_front();
    VESPER_CHECK(ref_counts_[id] == 0, "free block %d has ref_count %d", id, ref_counts_[id]);
    ref_counts_[id] = 1;
    ids.push_back(id);
  }
  return ids;
}

void BlockPool::add_ref(BlockId id) {
  VESPER_CHECK(id >= 0 && id < num_blocks() && ref_counts_[id] > 0, "add_ref on block %d (ref %d)", id,
               id >= 0 && id < num_blocks() ? ref_counts_[id] : -1);
  ++ref_counts_[id];
}

void BlockPool::release(BlockId id) {
  VESPER_CHECK(id >= 0 && id < num_blocks() && ref_counts_[id] > 0, "release of block %d (ref %d)", id,
               id >= 0 && id < num_blocks() ? ref_counts_[id] : -1);
  if (--ref_counts_[id] == 0) free_.push_back(id);
}

void BlockPool::check_invariants() const {
  std::vector<int> in_free(ref_counts_.size(), 0);
  for (BlockId id : free_) {
    VESPER_CHECK(id >= 0 && id < num_blocks(), "free list holds invalid block %d", id);
    ++in_free[id];
  }
  for (size_t i = 0; i < ref_counts_.size(); ++i) {
    VESPER_CHECK(ref_counts_[i] >= 0, "block %zu has negative ref_count", i);
    if (ref_counts_[i] == 0)
      VESPER_CHECK(in_free[i] == 1, "block %zu is unreferenced but in the free list %d times", i, in_free[i]);
    else
      VESPER_CHECK(in_free[i] == 0, "block %zu is referenced (%d) but in the free list", i, ref_counts_[i]);
  }
}

}  // namespace vesper::kv
