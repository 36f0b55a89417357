// KvTableLayout: how one sequence's block table maps token positions to table entries and KV row
// slots. The one place this arithmetic lives: the KV manager grows, trims and compacts tables by
// it (kv/kv_cache_manager.h), the runner and ForwardBatch turn positions into slots by it, and
// paged attention walks tables by it (cpu/attention_walk.h).
//
// Plain caches: block_size tokens a block; position p is row p % block_size of entry
// p / block_size. KIVI caches (kv_cache_spec.h): a table starts with `quantized_groups` entries
// that each hold one group of block_size tokens in quantized form; every later group's rows, as
// written, take blocks_per_group entries of rows_per_block rows each. Rows are written only past
// the quantized groups.
#pragma once

#include <cstdint>
#include <span>

#include "backend/kv_cache_spec.h"

namespace vesper::backend {

struct KvTableLayout {
  // A plain layout of block_size rows a block.
  KvTableLayout(int64_t block_size)  // NOLINT(google-explicit-constructor): the common case
      : block_size(block_size), rows_per_block(block_size) {}
  // The layout of tables over a cache of `spec` (KIVI's residual rows included).
  explicit KvTableLayout(const KvCacheSpec& spec)
      : block_size(spec.block_size),
        rows_per_block(spec.residual_rows_per_block()),
        blocks_per_group(spec.residual_blocks_per_group()) {}
  // A KIVI layout of `rows_per_block` residual rows a block (kv/ knows no spec, only this).
  static KvTableLayout kivi(int64_t group_size, int64_t rows_per_block) {
    KvTableLayout layout(group_size);
    layout.rows_per_block = rows_per_block;
    layout.blocks_per_group = (group_size + rows_per_block - 1) / rows_per_block;
    return layout;
  }

  int64_t block_size;      // tokens a block covers (a KIVI group's)
  int64_t rows_per_block;  // rows a block holds as written
  int64_t blocks_per_group = 1;
  // Per sequence: groups stored quantized at the front of its table (KIVI; else 0).
  int64_t quantized_groups = 0;

  // This layout for a sequence with `quantized` groups stored quantized.
  KvTableLayout with_quantized(int64_t quantized) const {
    KvTableLayout layout = *this;
    layout.quantized_groups = quantized;
    return layout;
  }
  // The group (block position) of position `pos`.
  int64_t group(int64_t pos) const { return pos / block_size; }
  // The first table entry of group g.
  int64_t group_entry(int64_t g) const {
    return g <= quantized_groups ? g : quantized_groups + (g - quantized_groups) * blocks_per_group;
  }
  // The group table entry e belongs to.
  int64_t group_of_entry(int64_t e) const {
    return e < quantized_groups ? e : quantized_groups + (e - quantized_groups) / blocks_per_group;
  }
  // Table entries covering positions [0, num_tokens).
  int64_t entries_for(int64_t num_tokens) const {
    return group_entry((num_tokens + block_size - 1) / block_size);
  }
  // Whether position `pos` is held as a written row (past the quantized groups).
  bool written_row(int64_t pos) const { return group(pos) >= quantized_groups; }
  // The table entry and the row within it that hold the written row of position `pos`.
  int64_t entry(int64_t pos) const {
    return group_entry(group(pos)) + pos % block_size / rows_per_block;
  }
  int64_t row(int64_t pos) const { return pos % block_size % rows_per_block; }
  // The KV slot of the written row of position `pos` in `table`.
  int64_t slot(std::span<const int32_t> table, int64_t pos) const {
    return int64_t{table[static_cast<size_t>(entry(pos))]} * rows_per_block + row(pos);
  }
  // The table entries of group g's written rows: blocks_per_group of them from here.
  const int32_t* group_rows(const int32_t* table, int64_t g) const {
    return table + group_entry(g);
  }
};

}  // namespace vesper::backend
