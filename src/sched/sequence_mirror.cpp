#include "sched/sequence_mirror.h"

#include <string>

namespace vesper::sched {

Status SequenceMirror::apply(const SchedulerOutput& plan) {
  for (SeqId id : plan.dropped) seqs_.erase(id);
  for (const NewSequenceData& n : plan.new_sequences) {
    auto [it, inserted] =
        seqs_.try_emplace(n.id, Entry{n.token_ids, n.block_table, n.adapter, n.quantized_groups});
    if (!inserted)
      return make_error("the plan adds sequence " + std::to_string(n.id) +
                        ", which the runner holds");
  }
  for (const CachedSequenceData& c : plan.cached_sequences) {
    auto it = seqs_.find(c.id);
    if (it == seqs_.end())
      return make_error("the plan updates sequence " + std::to_string(c.id) +
                        ", which the runner does not hold");
    Entry& e = it->second;
    e.tokens.insert(e.tokens.end(), c.new_token_ids.begin(), c.new_token_ids.end());
    const int64_t keep = c.num_blocks - static_cast<int64_t>(c.new_block_ids.size());
    if (keep < 0 || keep > static_cast<int64_t>(e.block_table.size()))
      return make_error("the plan keeps " + std::to_string(keep) + " blocks of sequence " +
                        std::to_string(c.id) + ", which has " +
                        std::to_string(e.block_table.size()));
    e.block_table.resize(keep);
    for (const BlockTableEntry& r : c.replaced_blocks) {
      if (r.index < 0 || r.index >= keep)
        return make_error("the plan replaces block " + std::to_string(r.index) + " of sequence " +
                          std::to_string(c.id) + ", outside its table");
      e.block_table[r.index] = r.block;
    }
    e.block_table.insert(e.block_table.end(), c.new_block_ids.begin(), c.new_block_ids.end());
    e.quantized_groups = c.quantized_groups;
  }
  for (const ScheduledSequence& s : plan.scheduled) {
    const Entry* e = find(s.id);
    if (e == nullptr)
      return make_error("the plan schedules sequence " + std::to_string(s.id) +
                        ", which the runner does not hold");
    const int64_t committed_end = s.start + s.num_new_tokens - s.num_spec_tokens;
    if (committed_end > static_cast<int64_t>(e->tokens.size()))
      return make_error("the plan computes tokens of sequence " + std::to_string(s.id) + " up to " +
                        std::to_string(committed_end) + " but the runner holds " +
                        std::to_string(e->tokens.size()));
  }
  return {};
}

const SequenceMirror::Entry* SequenceMirror::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

}  // namespace vesper::sched
