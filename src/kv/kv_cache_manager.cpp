#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace vesper::kv {

namespace {

// KIVI's prefix cache indexes each of a residual group's blocks on its own: block k under the
// chain hash of the group's tokens after residual_parent(h, k), h the group's chain hash. That
// parent is the hash of a one-token block, which no block of a real chain (block_size tokens)
// has, so these keys never meet a real chain's, and the pool's checks (hash = chain of parent
// and tokens, tokens compared on a hit) hold as they are.
BlockHash residual_parent(const BlockHash& group, int64_t k) {
  const auto index = static_cast<int32_t>(k);
  return chain_block_hash(group, std::span<const int32_t>(&index, 1));
}

BlockHash residual_block_hash(const BlockHash& group, int64_t k, std::span<const int32_t> tokens) {
  return chain_block_hash(residual_parent(group, k), tokens);
}

}  // namespace

KvCacheManager::KvCacheManager(int64_t num_device_blocks, int64_t num_host_blocks,
                               int64_t block_size, bool enable_prefix_caching)
    : layout_(block_size),
      prefix_caching_(enable_prefix_caching),
      device_(num_device_blocks, block_size),
      host_(num_host_blocks, block_size) {
  VESPER_CHECK(block_size > 0 && num_device_blocks > 0 && num_host_blocks >= 0);
}

void KvCacheManager::enable_kivi(int64_t rows_per_block, int64_t residual_length) {
  VESPER_CHECK(device_tables_.empty() && host_tables_.empty(), "enable_kivi with sequences");
  VESPER_CHECK(rows_per_block >= 1 && rows_per_block <= layout_.block_size && residual_length >= 0,
               "bad KIVI layout");
  kivi_ = true;
  layout_ = backend::KvTableLayout::kivi(layout_.block_size, rows_per_block);
  kivi_residual_ = residual_length;
}

int64_t KvCacheManager::slot(SeqId seq, int64_t pos) const {
  const std::vector<BlockId>& table = block_table(seq);
  const backend::KvTableLayout layout = layout_of(seq);
  VESPER_CHECK(layout.written_row(pos) && layout.entry(pos) < static_cast<int64_t>(table.size()),
               "sequence %lld: position %lld has no row slot (quantized, or past its table)",
               static_cast<long long>(seq), static_cast<long long>(pos));
  return layout.slot(table, pos);
}

int64_t KvCacheManager::quantized_groups(SeqId seq) const {
  auto it = quantized_.find(seq);
  return it == quantized_.end() ? 0 : it->second;
}

int64_t KvCacheManager::entries_for(SeqId seq, int64_t num_tokens) const {
  return layout_of(seq).entries_for(num_tokens);
}

std::vector<GroupQuantization> KvCacheManager::compact(SeqId seq, int64_t num_computed,
                                                       int64_t written) {
  std::vector<GroupQuantization> out;
  auto it = device_tables_.find(seq);
  if (!kivi_ || it == device_tables_.end()) return out;
  std::vector<BlockId>& table = it->second;
  const int64_t block_size = layout_.block_size, per_group = layout_.blocks_per_group;
  const int64_t before = num_computed + 1 - kivi_residual_;
  // Only groups whose rows are all written: a query at num_computed may read its own group
  // quantized (a residual window of 0), but its row is written after this, by the step.
  const int64_t target = std::min(
      {before <= 0 ? 0 : before / block_size, written / block_size, num_computed / block_size});
  int64_t& m = quantized_[seq];
  while (m < target && m + per_group <= static_cast<int64_t>(table.size()) &&
         device_.num_free() > 0) {
    // Allocate first: the group's own blocks, released below, must not become its destination.
    const BlockId dst = (*device_.allocate(1))[0];
    GroupQuantization q{std::vector<BlockId>(table.begin() + m, table.begin() + m + per_group),
                        dst};
    for (BlockId b : q.rows) device_.release(b);
    table.erase(table.begin() + m + 1, table.begin() + m + per_group);
    table[m] = dst;
    ++m;
    out.push_back(std::move(q));
  }
  return out;
}

bool KvCacheManager::prepare_step(SeqId seq, int64_t num_computed, int64_t written,
                                  const backend::KvSparsity& window, std::vector<BlockOp>& ops) {
  if (kivi_) {
    std::vector<GroupQuantization> quantized = compact(seq, num_computed, written);
    for (GroupQuantization& q : quantized) ops.push_back(BlockOp::quantize(std::move(q)));
    return !quantized.empty();
  }
  auto it = device_tables_.find(seq);
  if (!window.windowed() || it == device_tables_.end()) return false;
  // A query's gap only grows with its position: what the query at num_computed skips, no later
  // one reads. The blocks wholly inside it go back to the pool (a cached one stays findable:
  // only blocks of dense rows are cached, cache_full_blocks).
  std::vector<BlockId>& table = it->second;
  const int64_t bs = layout_.block_size;
  const int64_t first = (window.gap_begin() + bs - 1) / bs;
  const int64_t end =
      std::min<int64_t>(window.gap_end(num_computed) / bs, static_cast<int64_t>(table.size()));
  bool changed = false;
  for (int64_t e = first; e < end; ++e) {
    if (table[e] == kNoBlock) continue;
    device_.release(table[e]);
    table[e] = kNoBlock;
    changed = true;
  }
  return changed;
}

int64_t KvCacheManager::num_live_blocks(SeqId seq) const {
  auto d = device_tables_.find(seq);
  const std::vector<BlockId>* table =
      d != device_tables_.end() ? &d->second
                                : (host_tables_.count(seq) ? &host_tables_.at(seq) : nullptr);
  if (table == nullptr) return 0;
  return static_cast<int64_t>(
      std::count_if(table->begin(), table->end(), [](BlockId b) { return b != kNoBlock; }));
}

std::optional<KvAllocation> KvCacheManager::allocate_slots(SeqId seq, int64_t num_computed,
                                                           int64_t num_new, int64_t num_lookahead,
                                                           const PrefixMatch* prefix) {
  VESPER_CHECK(host_tables_.count(seq) == 0, "allocate_slots for swapped-out sequence %lld",
               static_cast<long long>(seq));
  VESPER_CHECK(num_computed >= 0 && num_new >= 0 && num_lookahead >= 0, "negative token counts");
  const int64_t written_end = num_computed + num_new;
  const int64_t num_tokens = written_end + num_lookahead;
  std::vector<BlockId>& table = device_tables_[seq];
  if (prefix != nullptr && !prefix->blocks.empty()) {
    VESPER_CHECK(
        table.empty() && num_computed == prefix->num_tokens && num_tokens > prefix->num_tokens,
        "prefix match applied to sequence %lld that holds blocks", static_cast<long long>(seq));
    // Matched blocks nobody references leave the evictable list and no longer count as free.
    int64_t revived = 0;
    for (BlockId b : prefix->blocks)
      if (device_.ref_count(b) == 0) ++revived;
    const int64_t need_new = blocks_for(num_tokens) - static_cast<int64_t>(prefix->blocks.size());
    if (need_new + revived > device_.num_free()) {
      device_tables_.erase(seq);
      return std::nullopt;
    }
    // Claim the matched blocks before allocating, so allocation cannot evict them.
    for (BlockId b : prefix->blocks) device_.add_ref(b);
    table = prefix->blocks;
    hashes_[seq] = prefix->hashes;
  }
  const int64_t have = static_cast<int64_t>(table.size());
  const backend::KvTableLayout layout = layout_of(seq);
  VESPER_CHECK(layout.written_row(num_computed), "sequence %lld writes into a quantized group",
               static_cast<long long>(seq));
  const int64_t need_new = std::max<int64_t>(0, entries_for(seq, num_tokens) - have);
  // Shared blocks among those written this step must become private first (with KIVI, those of
  // the groups written).
  const int64_t first_block = layout.group_entry(layout.group(num_computed));
  const int64_t last_block =
      num_new == 0 ? first_block : std::min(have, entries_for(seq, written_end));
  int64_t need_cow = 0;
  for (int64_t b = first_block; b < last_block; ++b)
    if (table[b] != kNoBlock && device_.ref_count(table[b]) > 1) ++need_cow;
  if (need_new + need_cow > device_.num_free()) {
    if (table.empty()) device_tables_.erase(seq);
    return std::nullopt;
  }
  KvAllocation granted;
  for (int64_t b = first_block; b < last_block; ++b) {
    if (table[b] == kNoBlock || device_.ref_count(table[b]) <= 1) continue;
    const BlockId fresh = (*device_.allocate(1))[0];
    granted.copies_.push_back({table[b], fresh});
    device_.release(table[b]);
    table[b] = fresh;
  }
  if (need_new > 0) {
    auto blocks = device_.allocate(need_new);
    table.insert(table.end(), blocks->begin(), blocks->end());
  }
  return granted;
}

void KvCacheManager::truncate(SeqId seq, int64_t num_tokens) {
  VESPER_CHECK(num_tokens >= 0, "truncate to a negative length");
  uncache_blocks_from(seq, num_tokens);
  auto it = device_tables_.find(seq);
  if (it == device_tables_.end()) return;
  std::vector<BlockId>& table = it->second;
  VESPER_CHECK(layout_of(seq).written_row(num_tokens),
               "truncate of sequence %lld into its quantized groups", static_cast<long long>(seq));
  const auto keep = static_cast<size_t>(entries_for(seq, num_tokens));
  // Last blocks first, as free() releases them.
  while (table.size() > keep) {
    if (table.back() != kNoBlock) device_.release(table.back());
    table.pop_back();
  }
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  auto it = device_tables_.find(parent);
  VESPER_CHECK(it != device_tables_.end(), "fork of sequence %lld without blocks",
               static_cast<long long>(parent));
  VESPER_CHECK(device_tables_.count(child) == 0, "fork into existing sequence %lld",
               static_cast<long long>(child));
  for (BlockId b : it->second)
    if (b != kNoBlock) device_.add_ref(b);
  device_tables_[child] = it->second;
  if (auto h = hashes_.find(parent); h != hashes_.end()) hashes_[child] = h->second;
  if (auto q = quantized_.find(parent); q != quantized_.end()) quantized_[child] = q->second;
}

void KvCacheManager::drop_copies_into(SeqId seq, std::vector<BlockOp>& planned) const {
  auto it = device_tables_.find(seq);
  if (it == device_tables_.end()) return;
  const std::vector<BlockId>& table = it->second;
  std::erase_if(planned, [&](const BlockOp& op) {
    return op.kind == BlockOp::Kind::kCopy &&
           std::find(table.begin(), table.end(), op.dst) != table.end();
  });
}

void KvCacheManager::free(SeqId seq, std::vector<BlockOp>* planned_ops) {
  if (planned_ops != nullptr) drop_copies_into(seq, *planned_ops);
  if (auto it = device_tables_.find(seq); it != device_tables_.end()) {
    // Release in reverse so a sequence's last blocks are reused first, its first blocks last.
    for (auto b = it->second.rbegin(); b != it->second.rend(); ++b)
      if (*b != kNoBlock) device_.release(*b);
    device_tables_.erase(it);
  }
  if (auto it = host_tables_.find(seq); it != host_tables_.end()) {
    for (BlockId b : it->second)
      if (b != kNoBlock) host_.release(b);
    host_tables_.erase(it);
  }
  hashes_.erase(seq);
  quantized_.erase(seq);
}

PrefixMatch KvCacheManager::match_prefix(std::span<const int32_t> tokens,
                                         const BlockHash& root) const {
  PrefixMatch m;
  if (!prefix_caching_ || tokens.empty()) return m;
  const int64_t block_size = layout_.block_size, per_group = layout_.blocks_per_group;
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / block_size;
  BlockHash parent = root;
  std::vector<BlockId> found;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const std::span<const int32_t> block = tokens.subspan(i * block_size, block_size);
    const BlockHash h = chain_block_hash(parent, block);
    // Without KIVI one block under h; with KIVI the group's residual blocks, each under its own
    // hash (residual_block_hash), all of them or no hit.
    found.clear();
    for (int64_t k = 0; k < per_group; ++k) {
      const BlockHash key = kivi_ ? residual_block_hash(h, k, block) : h;
      const std::optional<BlockId> id = device_.lookup(key);
      if (!id) break;
      // Belt and braces: a hit must also hold exactly these tokens.
      const std::span<const int32_t> cached = device_.tokens_of(*id);
      if (!std::equal(cached.begin(), cached.end(), block.begin(), block.end())) break;
      found.push_back(*id);
    }
    if (static_cast<int64_t>(found.size()) != per_group) break;
    m.blocks.insert(m.blocks.end(), found.begin(), found.end());
    m.hashes.push_back(h);
    parent = h;
  }
  m.num_tokens = static_cast<int64_t>(m.hashes.size()) * block_size;
  return m;
}

void KvCacheManager::cache_full_blocks(SeqId seq, std::span<const int32_t> tokens,
                                       int64_t num_computed, const BlockHash& root) {
  if (!prefix_caching_) return;
  auto t = device_tables_.find(seq);
  if (t == device_tables_.end()) return;
  const std::vector<BlockId>& table = t->second;
  std::vector<BlockHash>& hashes = hashes_[seq];
  const backend::KvTableLayout layout = layout_of(seq);
  const int64_t block_size = layout.block_size;
  const int64_t full = std::min<int64_t>(num_computed / block_size, groups_in(seq, table));
  for (int64_t i = static_cast<int64_t>(hashes.size()); i < full; ++i) {
    const BlockHash parent =
        i == 0 ? root : hashes[i - 1];  // a copy: push_back below may reallocate
    const std::span<const int32_t> block = tokens.subspan(i * block_size, block_size);
    const BlockHash h = chain_block_hash(parent, block);
    hashes.push_back(h);
    // False when the same content is already cached in another block (computed twice, e.g. by
    // two sequences admitted before either finished it): this copy simply stays private.
    if (!kivi_) {
      if (table[i] != kNoBlock) device_.register_block(table[i], parent, h, block);
      continue;
    }
    // KIVI: a group already quantized has no residual rows left to cache.
    if (!layout.written_row(i * block_size)) continue;
    for (int64_t k = 0; k < layout.blocks_per_group; ++k)
      device_.register_block(table[layout.group_entry(i) + k], residual_parent(h, k),
                             residual_block_hash(h, k, block), block);
  }
}

void KvCacheManager::uncache_blocks_from(SeqId seq, int64_t num_valid_tokens) {
  auto h = hashes_.find(seq);
  if (h == hashes_.end()) return;
  std::vector<BlockHash>& hashes = h->second;
  const int64_t keep = num_valid_tokens / layout_.block_size;
  if (static_cast<int64_t>(hashes.size()) <= keep) return;
  if (auto t = device_tables_.find(seq); t != device_tables_.end()) {
    const std::vector<BlockId>& table = t->second;
    const backend::KvTableLayout layout = layout_of(seq);
    for (int64_t i = keep; i < static_cast<int64_t>(hashes.size()); ++i) {
      for (int64_t k = 0; k < layout.blocks_per_group; ++k) {
        if (!layout.written_row(i * layout.block_size)) break;  // quantized: never cached
        const int64_t e = layout.group_entry(i) + k;
        if (e >= static_cast<int64_t>(table.size())) break;
        if (table[e] != kNoBlock && cached_as(table[e], hashes[i], k))
          device_.unregister_block(table[e]);
      }
    }
  }
  hashes.resize(keep);
}

std::span<const BlockHash> KvCacheManager::block_hashes(SeqId seq) const {
  auto h = hashes_.find(seq);
  if (h == hashes_.end()) return {};
  return h->second;
}

const std::vector<BlockId>& KvCacheManager::block_table(SeqId seq) const {
  static const std::vector<BlockId> kEmpty;
  auto it = device_tables_.find(seq);
  return it == device_tables_.end() ? kEmpty : it->second;
}

bool KvCacheManager::can_swap_out(SeqId seq) const {
  auto it = device_tables_.find(seq);
  return it != device_tables_.end() && num_live_blocks(seq) <= host_.num_free();
}

std::vector<SwapMapping> KvCacheManager::swap_out(SeqId seq) {
  VESPER_CHECK(can_swap_out(seq), "swap_out of sequence %lld without room",
               static_cast<long long>(seq));
  std::vector<BlockId>& table = device_tables_[seq];
  const auto fresh = *host_.allocate(num_live_blocks(seq));
  std::vector<BlockId> host_table(table.size(), kNoBlock);  // freed entries stay freed
  std::vector<SwapMapping> moves;
  for (size_t i = 0, next = 0; i < table.size(); ++i) {
    if (table[i] == kNoBlock) continue;
    host_table[i] = fresh[next++];
    moves.push_back({table[i], host_table[i]});
    device_.release(table[i]);
  }
  host_tables_[seq] = std::move(host_table);
  device_tables_.erase(seq);
  return moves;
}

bool KvCacheManager::can_swap_in(SeqId seq, int64_t num_tokens) const {
  auto it = host_tables_.find(seq);
  if (it == host_tables_.end()) return false;
  const int64_t grow =
      std::max<int64_t>(0, entries_for(seq, num_tokens) - static_cast<int64_t>(it->second.size()));
  return num_live_blocks(seq) + grow <= device_.num_free();
}

std::vector<SwapMapping> KvCacheManager::swap_in(SeqId seq) {
  VESPER_CHECK(can_swap_in(seq), "swap_in of sequence %lld without room",
               static_cast<long long>(seq));
  std::vector<BlockId>& host_blocks = host_tables_[seq];
  const auto fresh = *device_.allocate(num_live_blocks(seq));
  std::vector<BlockId> device_table(host_blocks.size(), kNoBlock);
  std::vector<SwapMapping> moves;
  for (size_t i = 0, next = 0; i < host_blocks.size(); ++i) {
    if (host_blocks[i] == kNoBlock) continue;
    device_table[i] = fresh[next++];
    moves.push_back({device_table[i], host_blocks[i]});
    host_.release(host_blocks[i]);
  }
  device_tables_[seq] = std::move(device_table);
  host_tables_.erase(seq);
  return moves;
}

void KvCacheManager::check_sequence(SeqId seq, std::span<const int32_t> tokens,
                                    int64_t num_committed) const {
  const std::vector<BlockId>& table = block_table(seq);
  const backend::KvTableLayout layout = layout_of(seq);
  const int64_t block_size = layout.block_size;
  VESPER_CHECK(static_cast<int64_t>(block_hashes(seq).size()) * block_size <= num_committed,
               "sequence %lld has hashed blocks past its committed tokens",
               static_cast<long long>(seq));
  for (size_t e = 0; e < table.size(); ++e) {
    if (table[e] == kNoBlock) continue;
    const std::span<const int32_t> cached = device_.tokens_of(table[e]);
    if (cached.empty()) continue;
    const int64_t i = layout.group_of_entry(static_cast<int64_t>(e));  // the block (group) position
    VESPER_CHECK((i + 1) * block_size <= static_cast<int64_t>(tokens.size()) &&
                     std::equal(cached.begin(), cached.end(), tokens.begin() + i * block_size),
                 "sequence %lld: cached block %d at position %lld holds other tokens",
                 static_cast<long long>(seq), table[e], static_cast<long long>(i));
  }
}

void KvCacheManager::check_invariants() const {
  device_.check_invariants();
  host_.check_invariants();
  std::vector<int32_t> device_refs(device_.num_blocks(), 0), host_refs(host_.num_blocks(), 0);
  for (const auto& [seq, table] : device_tables_) {
    VESPER_CHECK(host_tables_.count(seq) == 0, "sequence %lld is on both device and host",
                 static_cast<long long>(seq));
    for (BlockId b : table)
      if (b != kNoBlock) ++device_refs[b];
    const std::span<const BlockHash> hashes = block_hashes(seq);
    const int64_t groups = groups_in(seq, table);
    VESPER_CHECK(static_cast<int64_t>(hashes.size()) <= groups,
                 "sequence %lld has %zu block hashes for %lld blocks", static_cast<long long>(seq),
                 hashes.size(), static_cast<long long>(groups));
    const backend::KvTableLayout layout = layout_of(seq);
    for (size_t e = 0; e < table.size(); ++e) {
      if (table[e] == kNoBlock || device_.hash_of(table[e]) == nullptr) continue;
      const auto at = static_cast<int64_t>(e);
      const int64_t i = layout.group_of_entry(at);
      // Quantized groups are never cached; a residual group's blocks are, each as its k-th.
      VESPER_CHECK(layout.written_row(i * layout.block_size) &&
                       i < static_cast<int64_t>(hashes.size()) &&
                       cached_as(table[e], hashes[i], at - layout.group_entry(i)),
                   "sequence %lld: block %d at position %zu is cached under another prefix's hash",
                   static_cast<long long>(seq), table[e], e);
    }
  }
  for (const auto& [seq, m] : quantized_) {
    auto t = device_tables_.find(seq);
    const std::vector<BlockId>* table =
        t != device_tables_.end() ? &t->second : &host_tables_.at(seq);
    VESPER_CHECK(static_cast<int64_t>(table->size()) >= m &&
                     (static_cast<int64_t>(table->size()) - m) % layout_.blocks_per_group == 0,
                 "sequence %lld: %zu table entries for %lld quantized groups and whole residual "
                 "groups of %lld",
                 static_cast<long long>(seq), table->size(), static_cast<long long>(m),
                 static_cast<long long>(layout_.blocks_per_group));
  }
  for (const auto& [seq, hashes] : hashes_)
    VESPER_CHECK(device_tables_.count(seq) != 0 || host_tables_.count(seq) != 0,
                 "block hashes kept for sequence %lld, which holds no blocks",
                 static_cast<long long>(seq));
  for (const auto& [seq, table] : host_tables_)
    for (BlockId b : table)
      if (b != kNoBlock) ++host_refs[b];
  for (BlockId b = 0; b < device_.num_blocks(); ++b)
    VESPER_CHECK(device_refs[b] == device_.ref_count(b),
                 "device block %d: %d table entries, ref_count %d", b, device_refs[b],
                 device_.ref_count(b));
  for (BlockId b = 0; b < host_.num_blocks(); ++b)
    VESPER_CHECK(host_refs[b] == host_.ref_count(b),
                 "host block %d: %d table entries, ref_count %d", b, host_refs[b],
                 host_.ref_count(b));
}

bool KvCacheManager::cached_as(BlockId block, const BlockHash& group_hash, int64_t k) const {
  const BlockHash* cached = device_.hash_of(block);
  if (cached == nullptr) return false;
  if (!kivi_) return *cached == group_hash;
  return *cached == residual_block_hash(group_hash, k, device_.tokens_of(block));
}

}  // namespace vesper::kv
