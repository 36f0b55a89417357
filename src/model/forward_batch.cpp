#include "model/forward_batch.h"

#include "core/check.h"

namespace vesper::model {

void ForwardBatch::add_sequence(const std::vector<int32_t>& tokens, int32_t start_pos,
                                const std::vector<int32_t>& table, int64_t block_size,
                                bool want_logits) {
  if (query_start.empty()) query_start.push_back(0);
  if (table_offsets.empty()) table_offsets.push_back(0);
  const int32_t seq = static_cast<int32_t>(num_seqs());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = start_pos + static_cast<int32_t>(i);
    const int64_t block_index = pos / block_size;
    VESPER_CHECK(block_index < static_cast<int64_t>(table.size()), "block table too short for position %d", pos);
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    token_seq.push_back(seq);
    slot_mapping.push_back(int64_t{table[block_index]} * block_size + pos % block_size);
  }
  block_tables.insert(block_tables.end(), table.begin(), table.end());
  table_offsets.push_back(static_cast<int32_t>(block_tables.size()));
  query_start.push_back(static_cast<int32_t>(token_ids.size()));
  if (want_logits && !tokens.empty()) logits_rows.push_back(static_cast<int32_t>(token_ids.size()) - 1);
}

}  // namespace vesper::model
