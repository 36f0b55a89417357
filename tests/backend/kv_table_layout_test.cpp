#include "backend/kv_table_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

namespace vesper::backend {
namespace {

// A table laid out the slow way: quantized groups one entry each, then each later group's rows in
// blocks of rows_per_block, entry by entry; returns, for every position, (entry, row).
struct ExpectedLayout {
  std::vector<int64_t> entry, row;
  int64_t entries = 0;  // entries covering all positions
};

ExpectedLayout lay_out(int64_t block_size, int64_t rows_per_block, int64_t quantized,
                       int64_t tokens) {
  ExpectedLayout e;
  int64_t next = 0;
  for (int64_t g = 0; g * block_size < tokens; ++g) {
    if (g < quantized) {
      for (int64_t r = 0; r < block_size && g * block_size + r < tokens; ++r) {
        e.entry.push_back(next);
        e.row.push_back(-1);  // no written row
      }
      ++next;
      continue;
    }
    const int64_t blocks = (block_size + rows_per_block - 1) / rows_per_block;
    for (int64_t r = 0; r < block_size && g * block_size + r < tokens; ++r) {
      e.entry.push_back(next + r / rows_per_block);
      e.row.push_back(r % rows_per_block);
    }
    next += blocks;
  }
  e.entries = next;
  return e;
}

TEST(KvTableLayout, PlainTablesHoldBlockSizeRowsAnEntry) {
  const KvTableLayout layout(16);
  EXPECT_EQ(layout.entries_for(0), 0);
  EXPECT_EQ(layout.entries_for(1), 1);
  EXPECT_EQ(layout.entries_for(16), 1);
  EXPECT_EQ(layout.entries_for(17), 2);
  const std::vector<int32_t> table = {7, 3, 9};
  EXPECT_EQ(layout.slot(table, 0), 7 * 16);
  EXPECT_EQ(layout.slot(table, 17), 3 * 16 + 1);
  EXPECT_EQ(layout.slot(table, 47), 9 * 16 + 15);
  EXPECT_TRUE(layout.written_row(0));
}

// Every geometry KIVI uses (rows a block dividing the group or not) and every number of quantized
// groups: entries, rows, slots and the entry-to-group inverse agree with the table laid out by
// hand, and no two positions share a slot.
TEST(KvTableLayout, KiviTablesMatchTheLayoutBuiltByHand) {
  for (const int64_t bs : {32, 64}) {
    for (const int64_t rows : {1, 5, 12, 32}) {
      for (const int64_t quantized : {0, 1, 3}) {
        const int64_t tokens = 5 * bs + 7;
        const KvTableLayout layout = KvTableLayout::kivi(bs, rows).with_quantized(quantized);
        const ExpectedLayout e = lay_out(bs, rows, quantized, tokens);
        ASSERT_EQ(layout.entries_for(tokens), e.entries) << bs << " " << rows << " " << quantized;
        std::vector<int32_t> table;
        for (int64_t i = 0; i < e.entries; ++i) table.push_back(static_cast<int32_t>(100 + 3 * i));
        std::set<int64_t> slots;
        for (int64_t pos = 0; pos < tokens; ++pos) {
          const bool written = e.row[static_cast<size_t>(pos)] >= 0;
          ASSERT_EQ(layout.written_row(pos), written) << pos;
          EXPECT_EQ(layout.group_of_entry(e.entry[static_cast<size_t>(pos)]), pos / bs) << pos;
          if (!written) continue;
          ASSERT_EQ(layout.entry(pos), e.entry[static_cast<size_t>(pos)]) << pos;
          ASSERT_EQ(layout.row(pos), e.row[static_cast<size_t>(pos)]) << pos;
          EXPECT_TRUE(slots.insert(layout.slot(table, pos)).second)
              << "slot of " << pos << " reused";
          // The position's entry is among its group's residual blocks.
          const int64_t first = layout.group_rows(table.data(), pos / bs) - table.data();
          EXPECT_GE(layout.entry(pos), first) << pos;
          EXPECT_LT(layout.entry(pos), first + layout.blocks_per_group) << pos;
        }
      }
    }
  }
}

// The layout the engine derives from a cache spec is the one the KV manager builds from the
// group size and rows per block alone.
TEST(KvTableLayout, SpecAndKiviConstructorsAgree) {
  KvCacheSpec spec;
  spec.dtypes = {KvDtype::kKivi2, KvDtype::kKivi2};
  spec.n_layers = 2;
  spec.block_size = 32;
  spec.n_kv_heads = 2;
  spec.head_dim = 64;
  spec.kivi_residual_length = 64;
  const KvTableLayout from_spec(spec);
  const KvTableLayout from_geometry =
      KvTableLayout::kivi(spec.block_size, spec.residual_rows_per_block());
  EXPECT_EQ(from_spec.rows_per_block, from_geometry.rows_per_block);
  EXPECT_EQ(from_spec.blocks_per_group, from_geometry.blocks_per_group);
  EXPECT_GT(from_spec.blocks_per_group, 1);
}

}  // namespace
}  // namespace vesper::backend
