// ForwardBatch: everything one forward pass needs, as flat arrays. Prefill chunks, decodes and
// verifications of many sequences ride in one batch with no padding; the model does not know
// what a request is. Tokens of one sequence are contiguous: sequence s owns rows
// [query_start[s], query_start[s + 1]).
//
// Attention: a row attends to its sequence's K/V at positions 0..its position (causal), unless
// its sequence has a tree description (speculative candidates shaped as a tree, as Medusa
// verifies them): then a row attends to the sequence's context (positions before its first row)
// and to the rows on its own path from the tree's root, and no other row. Each row's K/V goes to
// its own slot (slot_mapping), so rows at the same depth (same position) do not collide.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_cache_spec.h"
#include "backend/kv_table_layout.h"
#include "backend/paged_attention.h"

namespace vesper::model {

// How a sequence's block table maps positions to KV slots (backend/kv_table_layout.h).
using backend::KvTableLayout;

// tree_parents value for the rows of sequences without a tree description.
inline constexpr int32_t kNoTree = backend::kNotInTree;

struct ForwardBatch {
  std::vector<int32_t> token_ids;      // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens] position of each token in its sequence
  std::vector<int32_t> token_seq;      // [num_tokens] which sequence each token belongs to
  std::vector<int32_t> query_start;    // [num_seqs + 1]
  std::vector<int32_t> block_tables;   // flat: sequence s's blocks start at table_offsets[s]
  std::vector<int32_t> table_offsets;  // [num_seqs + 1]
  std::vector<int64_t> slot_mapping;   // [num_tokens] KV cache slot of each token
  std::vector<int32_t> logits_rows;    // rows whose logits are wanted, in output order
  // [num_seqs] the adapter (LoRA) slot of each sequence; -1: the base model alone.
  std::vector<int32_t> seq_adapter;
  // Empty when no sequence has a tree; else [num_tokens]: for rows of a tree sequence, the
  // parent's row as an offset within the sequence's rows (-1: the root, which follows the
  // context); kNoTree for rows of other sequences.
  std::vector<int32_t> tree_parents;
  // Empty when no sequence has a quantized KIVI group; else [num_seqs] each one's count.
  std::vector<int32_t> quantized_groups;
  // Empty when no row skips positions (sinks + window, backend::KvSparsity); else
  // [num_tokens] the positions [gap_begin, gap_end) each row does not attend.
  std::vector<int32_t> gap_begin;
  std::vector<int32_t> gap_end;
  // Empty when no row has a Quest budget (backend::KvSparsity); else [num_tokens] each row's
  // budget in tokens (0: it reads everything).
  std::vector<int32_t> block_budget;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const {
    return query_start.empty() ? 0 : static_cast<int64_t>(query_start.size()) - 1;
  }
  bool has_trees() const { return !tree_parents.empty(); }

  void clear() {
    token_ids.clear();
    positions.clear();
    token_seq.clear();
    query_start.clear();
    block_tables.clear();
    table_offsets.clear();
    slot_mapping.clear();
    logits_rows.clear();
    seq_adapter.clear();
    tree_parents.clear();
    quantized_groups.clear();
    gap_begin.clear();
    gap_end.clear();
    block_budget.clear();
  }

  // The batch builder (runners and tests alike): appends a run of `tokens` of one sequence
  // starting at position `start_pos`, whose block table is `table` (laid out as `layout` says:
  // block_size tokens per block without KIVI). The last `num_logits_rows` rows want logits.
  // `adapter` is the sequence's adapter slot. With `tree_parents` (one per token: the parent's
  // offset among these tokens, -1 for the root, parents before children), the tokens form a tree: a
  // row's position is start_pos plus its depth, and its K/V slot is that of position start_pos +
  // its offset. With `sparsity`, rows at positions from its dense_from skip the positions between
  // the sinks and their window (table entries there may be freed), or read their Quest budget.
  void add_sequence(std::span<const int32_t> tokens, int32_t start_pos,
                    std::span<const int32_t> table, KvTableLayout layout, int64_t num_logits_rows,
                    int32_t adapter = -1, std::span<const int32_t> tree_parents = {},
                    const backend::KvSparsity& sparsity = {});
};

}  // namespace vesper::model
