// ForwardBatch: everything one forward pass needs, as flat arrays. Prefill chunks and decodes
// of many sequences ride in one batch with no padding; the model does not know what a request
// is. Tokens of one sequence are contiguous: sequence s owns rows
// [query_start[s], query_start[s + 1]).
#pragma once

#include <cstdint>
#include <vector>

namespace vesper::model {

struct ForwardBatch {
  std::vector<int32_t> token_ids;      // [num_tokens]
  std::vector<int32_t> positions;      // [num_tokens] position of each token in its sequence
  std::vector<int32_t> token_seq;      // [num_tokens] which sequence each token belongs to
  std::vector<int32_t> query_start;    // [num_seqs + 1]
  std::vector<int32_t> block_tables;   // flat: sequence s's blocks start at table_offsets[s]
  std::vector<int32_t> table_offsets;  // [num_seqs + 1]
  std::vector<int64_t> slot_mapping;   // [num_tokens] KV cache slot of each token
  std::vector<int32_t> logits_rows;    // rows whose logits are wanted, in output order

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  int64_t num_seqs() const { return query_start.empty() ? 0 : static_cast<int64_t>(query_start.size()) - 1; }

  void clear() {
    token_ids.clear();
    positions.clear();
    token_seq.clear();
    query_start.clear();
    block_tables.clear();
    table_offsets.clear();
    slot_mapping.clear();
    logits_rows.clear();
  }

  // Appends a run of `tokens` of one sequence starting at position `start_pos`, whose block
  // table is `table` (block_size tokens per block). `want_logits` asks for the last token's
  // logits. Used by runners and tests to build batches.
  void add_sequence(const std::vector<int32_t>& tokens, int32_t start_pos,
                    const std::vector<int32_t>& table, int64_t block_size, bool want_logits);
};

}  // namespace vesper::model
