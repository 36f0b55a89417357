#include "model/forward_batch.h"

#include "core/check.h"

namespace vesper::model {

void ForwardBatch::add_sequence(std::span<const int32_t> tokens, int32_t start_pos,
                                std::span<const int32_t> table, KvTableLayout layout,
                                int64_t num_logits_rows, int32_t adapter,
                                std::span<const int32_t> parents,
                                const backend::KvSparsity& sparsity) {
  if (query_start.empty()) query_start.push_back(0);
  if (table_offsets.empty()) table_offsets.push_back(0);
  const bool tree = !parents.empty();
  VESPER_CHECK(!tree || parents.size() == tokens.size(), "a tree of %zu parents for %zu tokens",
               parents.size(), tokens.size());
  VESPER_CHECK(num_logits_rows >= 0 && num_logits_rows <= static_cast<int64_t>(tokens.size()),
               "%lld logits rows of %zu tokens", static_cast<long long>(num_logits_rows),
               tokens.size());
  VESPER_CHECK(!tree || !sparsity.enabled(), "a tree with KV sparsity");
  if (tree && tree_parents.empty()) tree_parents.assign(token_ids.size(), kNoTree);
  // Gaps and budgets only start as positions grow: whether the last row has one says whether any
  // does. Rows before the batch's first row with one have none.
  const int64_t last = start_pos + static_cast<int64_t>(tokens.size()) - 1;
  const bool gaps = sparsity.gap_end(last) > sparsity.gap_begin();
  const bool budgets = sparsity.budget(last) > 0;
  if (gaps && gap_begin.empty()) {
    gap_begin.assign(token_ids.size(), 0);
    gap_end.assign(token_ids.size(), 0);
  }
  if (budgets && block_budget.empty()) block_budget.assign(token_ids.size(), 0);
  const int32_t seq = static_cast<int32_t>(num_seqs());
  const size_t first_row = token_ids.size();
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t depth = static_cast<int32_t>(i);
    if (tree) {
      VESPER_CHECK(parents[i] >= -1 && parents[i] < static_cast<int32_t>(i),
                   "tree node %zu has parent %d", i, parents[i]);
      depth = parents[i] < 0 ? 0 : positions[first_row + parents[i]] - start_pos + 1;
    }
    const int32_t slot_pos = start_pos + static_cast<int32_t>(i);
    VESPER_CHECK(
        layout.written_row(slot_pos) && layout.entry(slot_pos) < static_cast<int64_t>(table.size()),
        "block table too short for position %d, or the position is quantized", slot_pos);
    token_ids.push_back(tokens[i]);
    positions.push_back(start_pos + depth);
    token_seq.push_back(seq);
    slot_mapping.push_back(layout.slot(table, slot_pos));
    if (tree)
      tree_parents.push_back(parents[i]);
    else if (!tree_parents.empty())
      tree_parents.push_back(kNoTree);
    if (gaps || !gap_begin.empty()) {
      gap_begin.push_back(static_cast<int32_t>(sparsity.gap_begin()));
      gap_end.push_back(static_cast<int32_t>(sparsity.gap_end(start_pos + depth)));
    }
    if (budgets || !block_budget.empty())
      block_budget.push_back(static_cast<int32_t>(sparsity.budget(start_pos + depth)));
  }
  // Sequences before the first with quantized groups have none.
  if (layout.quantized_groups > 0 || !quantized_groups.empty()) {
    quantized_groups.resize(static_cast<size_t>(seq), 0);
    quantized_groups.push_back(static_cast<int32_t>(layout.quantized_groups));
  }
  block_tables.insert(block_tables.end(), table.begin(), table.end());
  table_offsets.push_back(static_cast<int32_t>(block_tables.size()));
  query_start.push_back(static_cast<int32_t>(token_ids.size()));
  seq_adapter.push_back(adapter);
  for (int64_t r = static_cast<int64_t>(tokens.size()) - num_logits_rows;
       r < static_cast<int64_t>(tokens.size()); ++r)
    logits_rows.push_back(static_cast<int32_t>(first_row + r));
}

}  // namespace vesper::model
