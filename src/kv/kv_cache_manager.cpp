#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace vesper::kv {

KvCacheManager::KvCacheManager(int64_t num_device_blocks, int64_t num_host_blocks, int64_t block_size)
    : block_size_(block_size), device_(num_device_blocks), host_(num_host_blocks) {
  VESPER_CHECK(block_size > 0 && num_device_blocks > 0 && num_host_blocks >= 0);
}

bool KvCacheManager::allocate_slots(SeqId seq, int64_t first_written, int64_t num_tokens,
                                    std::vector<BlockCopy>& copies) {
  VESPER_CHECK(host_tables_.count(seq) == 0, "allocate_slots for swapped-out sequence %lld",
               static_cast<long long>(seq));
  std::vector<BlockId>& table = device_tables_[seq];
  const int64_t have = static_cast<int64_t>(table.size());
  const int64_t need_new = std::max<int64_t>(0, blocks_for(num_tokens) - have);
  // Shared blocks among those written this step must become private first.
  const int64_t first_block = first_written / block_size_;
  const int64_t last_block = std::min(have, blocks_for(num_tokens));
  int64_t need_cow = 0;
  for (int64_t b = first_block; b < last_block; ++b)
    if (device_.ref_count(table[b]) > 1) ++need_cow;
  if (need_new + need_cow > device_.num_free()) {
    if (table.empty()) device_tables_.erase(seq);
    return false;
  }
  for (int64_t b = first_block; b < last_block; ++b) {
    if (device_.ref_count(table[b]) <= 1) continue;
    const BlockId fresh = (*device_.allocate(1))[0];
    copies.push_back({table[b], fresh});
    device_.release(table[b]);
    table[b] = fresh;
  }
  if (need_new > 0) {
    auto blocks = device_.allocate(need_new);
    table.insert(table.end(), blocks->begin(), blocks->end());
  }
  return true;
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  auto it = device_tables_.find(parent);
  VESPER_CHECK(it != device_tables_.end(), "fork of sequence %lld without blocks", static_cast<long long>(parent));
  VESPER_CHECK(device_tables_.count(child) == 0, "fork into existing sequence %lld", static_cast<long long>(child));
  for (BlockId b : it->second) device_.add_ref(b);
  device_tables_[child] = it->second;
}

void KvCacheManager::free(SeqId seq) {
  if (auto it = device_tables_.find(seq); it != device_tables_.end()) {
    // Release in reverse so a sequence's last blocks are reused first, its first blocks last.
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b) device_.release(*b);
    device_tables_.erase(it);
  }
  if (auto it = host_tables_.find(seq); it != host_tables_.end()) {
    for (BlockId b : it->second) host_.release(b);
    host_tables_.erase(it);
  }
}

const std::vector<BlockId>& KvCacheManager::block_table(SeqId seq) const {
  static const std::vector<BlockId> kEmpty;
  auto it = device_tables_.find(seq);
  return it == device_tables_.end() ? kEmpty : it->second;
}

bool KvCacheManager::can_swap_out(SeqId seq) const {
  auto it = device_tables_.find(seq);
  return it != device_tables_.end() && static_cast<int64_t>(it->second.size()) <= host_.num_free();
}

std::vector<SwapMapping> KvCacheManager::swap_out(SeqId seq) {
  VESPER_CHECK(can_swap_out(seq), "swap_out of sequence %lld without room", static_cast<long long>(seq));
  std::vector<BlockId>& table = device_tables_[seq];
  auto host_blocks = *host_.allocate(static_cast<int64_t>(table.size()));
  std::vector<SwapMapping> moves;
  for (size_t i = 0; i < table.size(); ++i) {
    moves.push_back({table[i], host_blocks[i]});
    device_.release(table[i]);
  }
  host_tables_[seq] = std::move(host_blocks);
  device_tables_.erase(seq);
  return moves;
}

bool KvCacheManager::can_swap_in(SeqId seq, int64_t num_tokens) const {
  auto it = host_tables_.find(seq);
  if (it == host_tables_.end()) return false;
  const int64_t blocks = std::max<int64_t>(static_cast<int64_t>(it->second.size()), blocks_for(num_tokens));
  return blocks <= device_.num_free();
}

std::vector<SwapMapping> KvCacheManager::swap_in(SeqId seq) {
  VESPER_CHECK(can_swap_in(seq), "swap_in of sequence %lld without room", static_cast<long long>(seq));
  std::vector<BlockId>& host_blocks = host_tables_[seq];
  auto device_blocks = *device_.allocate(static_cast<int64_t>(host_blocks.size()));
  std::vector<SwapMapping> moves;
  for (size_t i = 0; i < host_blocks.size(); ++i) {
    moves.push_back({device_blocks[i], host_blocks[i]});
    host_.release(host_blocks[i]);
  }
  device_tables_[seq] = std::move(device_blocks);
  host_tables_.erase(seq);
  return moves;
}

void KvCacheManager::check_invariants() const {
  device_.check_invariants();
  host_.check_invariants();
  std::vector<int32_t> device_refs(device_.num_blocks(), 0), host_refs(host_.num_blocks(), 0);
  for (const auto& [seq, table] : device_tables_) {
    VESPER_CHECK(host_tables_.count(seq) == 0, "sequence %lld is on both device and host", static_cast<long long>(seq));
    for (BlockId b : table) ++device_refs[b];
  }
  for (const auto& [seq, table] : host_tables_)
    for (BlockId b : table) ++host_refs[b];
  for (BlockId b = 0; b < device_.num_blocks(); ++b)
    VESPER_CHECK(device_refs[b] == device_.ref_count(b), "device block %d: %d table entries, ref_count %d", b,
                 device_refs[b], device_.ref_count(b));
  for (BlockId b = 0; b < host_.num_blocks(); ++b)
    VESPER_CHECK(host_refs[b] == host_.ref_count(b), "host block %d: %d table entries, ref_count %d", b,
                 host_refs[b], host_.ref_count(b));
}

}  // namespace vesper::kv
