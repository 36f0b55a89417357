#include "engine/model_runner.h"

namespace vesper::engine {

ModelRunner::ModelRunner(model::Model& model, int64_t num_blocks, int64_t num_swap_blocks, int64_t block_size,
                         ThreadPool& pool)
    : model_(model),
      pool_(pool),
      block_size_(block_size),
      device_(model.kv_shape(num_blocks, block_size)),
      host_(model.kv_shape(num_swap_blocks, block_size)) {}

void ModelRunner::execute(const sched::SchedulerOutput& step, const sched::Scheduler& scheduler) {
  // Order matters: swap-outs read blocks that this step may hand to others, so they go first.
  for (const auto& m : step.swap_out) host_.copy_block_from(device_, m.device, m.host);
  for (const auto& m : step.swap_in) device_.copy_block_from(host_, m.host, m.device);
  for (const auto& c : step.block_copies) device_.copy_block(c.src, c.dst);

  batch_.clear();
  sampled_ids_.clear();
  batch_.query_start.push_back(0);
  batch_.table_offsets.push_back(0);
  for (const auto& s : step.scheduled) {
    const sched::Sequence* seq = scheduler.find(s.id);
    const auto& table = scheduler.kv().block_table(s.id);
    const int32_t index = static_cast<int32_t>(batch_.num_seqs());
    for (int64_t i = 0; i < s.num_new_tokens; ++i) {
      const int64_t pos = s.start + i;
      batch_.token_ids.push_back(seq->tokens[pos]);
      batch_.positions.push_back(static_cast<int32_t>(pos));
      batch_.token_seq.push_back(index);
      batch_.slot_mapping.push_back(int64_t{table[pos / block_size_]} * block_size_ + pos % block_size_);
    }
    batch_.block_tables.insert(batch_.block_tables.end(), table.begin(), table.end());
    batch_.table_offsets.push_back(static_cast<int32_t>(batch_.block_tables.size()));
    batch_.query_start.push_back(static_cast<int32_t>(batch_.token_ids.size()));
    if (s.samples) {
      batch_.logits_rows.push_back(static_cast<int32_t>(batch_.token_ids.size()) - 1);
      sampled_ids_.push_back(s.id);
    }
  }
  logits_.resize(batch_.logits_rows.size() * model_.config().n_vocab);
  if (batch_.num_tokens() > 0) model_.forward(batch_, device_, logits_.data(), pool_);
}

}  // namespace vesper::engine
