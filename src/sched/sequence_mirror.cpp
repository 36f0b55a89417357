#include "sched/sequence_mirror.h"

#include <span>
#include <string>

#include "core/check.h"

namespace vesper::sched {

void SequenceMirror::count(const std::vector<kv::BlockId>& table, int32_t delta) {
  for (const kv::BlockId b : table) {
    if (b == kv::kNoBlock) continue;
    const auto i = static_cast<size_t>(b);
    if (i >= refs_.size()) refs_.resize(i + 1, 0);
    refs_[i] += delta;
  }
}

Status SequenceMirror::check_blocks(SeqId id, std::span<const kv::BlockId> blocks) const {
  for (const kv::BlockId b : blocks)
    if (b != kv::kNoBlock && (b < 0 || (num_blocks_ > 0 && b >= num_blocks_)))
      return make_error("the plan gives sequence " + std::to_string(id) + " block " +
                        std::to_string(b) + ", outside the " + std::to_string(num_blocks_) +
                        " blocks of storage");
  return {};
}

Status SequenceMirror::apply(const SchedulerOutput& plan) {
  for (SeqId id : plan.finished) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    if (it->second.resident) count(it->second.block_table, -1);
    seqs_.erase(it);
  }
  for (SeqId id : plan.preempted) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || !it->second.resident)
      return make_error("the plan preempts sequence " + std::to_string(id) +
                        ", which the runner does not hold resident");
    count(it->second.block_table, -1);
    it->second.block_table.clear();
    it->second.resident = false;
    it->second.num_computed = 0;
  }
  for (const NewSequenceData& n : plan.new_sequences) {
    if (seqs_.count(n.id) != 0)
      return make_error("the plan adds sequence " + std::to_string(n.id) +
                        ", which the runner holds");
    if (n.sampling.params == nullptr)
      return make_error("the plan adds sequence " + std::to_string(n.id) +
                        " without sampling parameters");
    VESPER_TRY(check_blocks(n.id, n.block_table));
    if (n_vocab_ > 0) {
      for (const int32_t t : n.token_ids)
        if (t < 0 || t >= n_vocab_)
          return make_error("the plan adds sequence " + std::to_string(n.id) + " with token " +
                            std::to_string(t) + ", outside the vocabulary");
      if (Status st = n.sampling.params->validate_token_ids(n_vocab_); !st)
        return make_error("sequence " + std::to_string(n.id) + ": " + st.error().message);
    }
    Entry& e = seqs_[n.id];
    e.tokens = n.token_ids;
    e.num_prompt_tokens = n.num_prompt_tokens;
    e.resident = true;
    e.block_table = n.block_table;
    e.adapter = n.adapter;
    e.quantized_groups = n.quantized_groups;
    e.sampling = n.sampling;
    e.rng.seed(n.sampling.seed);
    count(e.block_table, 1);
  }
  for (const CachedSequenceData& c : plan.cached_sequences) {
    auto it = seqs_.find(c.id);
    if (it == seqs_.end())
      return make_error("the plan updates sequence " + std::to_string(c.id) +
                        ", which the runner does not hold");
    Entry& e = it->second;
    if (c.num_tokens > static_cast<int64_t>(e.tokens.size()))
      return make_error("the plan says sequence " + std::to_string(c.id) + " has " +
                        std::to_string(c.num_tokens) + " tokens but the runner holds " +
                        std::to_string(e.tokens.size()));
    if (e.resident == c.resumed)
      return make_error(std::string("the plan ") + (c.resumed ? "resumes" : "updates") +
                        " sequence " + std::to_string(c.id) + ", which the runner holds " +
                        (e.resident ? "resident" : "preempted"));
    const int64_t keep = c.num_blocks - static_cast<int64_t>(c.new_block_ids.size());
    if (keep < 0 || keep > static_cast<int64_t>(e.block_table.size()))
      return make_error("the plan keeps " + std::to_string(keep) + " blocks of sequence " +
                        std::to_string(c.id) + ", which has " +
                        std::to_string(e.block_table.size()));
    for (const BlockTableEntry& r : c.replaced_blocks) {
      if (r.index < 0 || r.index >= keep)
        return make_error("the plan replaces block " + std::to_string(r.index) + " of sequence " +
                          std::to_string(c.id) + ", outside its table");
      VESPER_TRY(check_blocks(c.id, std::span(&r.block, 1)));
    }
    VESPER_TRY(check_blocks(c.id, c.new_block_ids));
    count(e.block_table, -1);
    e.block_table.resize(keep);
    for (const BlockTableEntry& r : c.replaced_blocks) e.block_table[r.index] = r.block;
    e.block_table.insert(e.block_table.end(), c.new_block_ids.begin(), c.new_block_ids.end());
    count(e.block_table, 1);
    e.resident = true;
    e.quantized_groups = c.quantized_groups;
    e.adapter = c.adapter;
  }
  for (const ScheduledSequence& s : plan.scheduled) {
    Entry* e = find(s.id);
    if (e == nullptr || !e->resident)
      return make_error("the plan schedules sequence " + std::to_string(s.id) +
                        ", which the runner does not hold resident");
    // A sequence a token ended in a step the scheduler had not read yet holds fewer tokens than
    // the plan counts on; the runner computes nothing more of it.
    if (e->stopped) continue;
    const int64_t committed_end = s.start + s.num_new_tokens - s.num_spec_tokens;
    if (committed_end > static_cast<int64_t>(e->tokens.size()))
      return make_error("the plan computes tokens of sequence " + std::to_string(s.id) + " up to " +
                        std::to_string(committed_end) + " but the runner holds " +
                        std::to_string(e->tokens.size()));
    if (s.samples() && committed_end != static_cast<int64_t>(e->tokens.size()))
      return make_error("the plan samples sequence " + std::to_string(s.id) + " at " +
                        std::to_string(committed_end) + " of its " +
                        std::to_string(e->tokens.size()) + " tokens");
    e->num_computed = committed_end;
  }
  // Forks come in the plan's order of their parents, each parent sampling in the plan (its
  // children draw their first tokens from its row).
  size_t entry = 0;
  for (const ForkData& f : plan.forks) {
    while (entry < plan.scheduled.size() && plan.scheduled[entry].id != f.parent) ++entry;
    if (entry == plan.scheduled.size() || !plan.scheduled[entry].samples())
      return make_error("the plan forks sequence " + std::to_string(f.parent) +
                        ", which does not sample in it (or out of the plan's order)");
  }
  for (const ForkData& f : plan.forks) {
    auto parent = seqs_.find(f.parent);
    if (parent == seqs_.end() || !parent->second.resident)
      return make_error("the plan forks sequence " + std::to_string(f.parent) +
                        ", which the runner does not hold resident");
    if (seqs_.count(f.child) != 0)
      return make_error("the plan forks into sequence " + std::to_string(f.child) +
                        ", which the runner holds");
    const Entry& p = parent->second;
    Entry& child = seqs_[f.child];
    child.tokens = p.tokens;
    child.num_prompt_tokens = p.num_prompt_tokens;
    child.resident = true;
    child.block_table = p.block_table;
    child.adapter = p.adapter;
    child.quantized_groups = p.quantized_groups;
    child.num_computed = p.num_computed;  // the parent's, as this plan leaves it
    child.sampling = SamplingSetup{p.sampling.params, f.seed};
    child.rng.seed(f.seed);
    count(child.block_table, 1);
  }
  return {};
}

SequenceMirror::Entry* SequenceMirror::find(SeqId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

const SequenceMirror::Entry* SequenceMirror::find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

void SequenceMirror::append(SeqId id, std::span<const int32_t> tokens) {
  Entry* e = find(id);
  VESPER_CHECK(e != nullptr, "tokens for sequence %lld, which the mirror does not hold",
               static_cast<long long>(id));
  e->tokens.insert(e->tokens.end(), tokens.begin(), tokens.end());
}

}  // namespace vesper::sched
