#include "sched/scheduler_output.h"

#include <cstdint>

#include "core/byte_stream.h"

namespace vesper::sched {
namespace {

constexpr uint64_t kMagic =
    0x56535035;  // "VSP5": the format's version (5: one ordered list of block ops)

#define VESPER_READ(var, expr)                    \
  auto var##_result = (expr);                     \
  if (!var##_result) return var##_result.error(); \
  const auto var = *var##_result

// Block ids index storage: a negative one is corrupt, except, in a table, kv::kNoBlock (an entry
// whose block was freed).
Status check_blocks(std::span<const int32_t> ids, bool table = false) {
  for (const int32_t id : ids)
    if (id < 0 && !(table && id == kv::kNoBlock))
      return make_error("a negative block id (" + std::to_string(id) + ")");
  return {};
}

}  // namespace

std::vector<uint8_t> SchedulerOutput::serialize() const {
  ByteWriter w;
  w.u64(kMagic);
  w.ints<SeqId>(finished);
  w.ints<SeqId>(preempted);
  w.ints<SeqId>(recomputed);
  w.u64(new_sequences.size());
  for (const auto& n : new_sequences) {
    w.i64(n.id);
    w.ints<int32_t>(n.token_ids);
    w.i64(n.num_prompt_tokens);
    w.ints<kv::BlockId>(n.block_table);
    w.i64(n.adapter);
    w.i64(n.quantized_groups);
    sample::write_sampling_params(w, *n.sampling.params);
    w.u64(n.sampling.seed);
  }
  w.u64(cached_sequences.size());
  for (const auto& c : cached_sequences) {
    w.i64(c.id);
    w.boolean(c.resumed);
    w.i64(c.num_tokens);
    w.i64(c.num_blocks);
    std::vector<int32_t> replaced;
    for (const auto& e : c.replaced_blocks) {
      replaced.push_back(e.index);
      replaced.push_back(e.block);
    }
    w.ints<int32_t>(replaced);
    w.ints<kv::BlockId>(c.new_block_ids);
    w.i64(c.quantized_groups);
    w.i64(c.adapter);
  }
  w.u64(forks.size());
  for (const auto& f : forks) {
    w.i64(f.parent);
    w.i64(f.child);
    w.u64(f.seed);
  }
  w.u64(block_ops.size());
  for (const kv::BlockOp& op : block_ops) {
    w.u64(static_cast<uint64_t>(op.kind));
    w.i64(op.src);
    w.i64(op.dst);
    w.ints<kv::BlockId>(op.rows);
  }
  w.u64(scheduled.size());
  for (const auto& s : scheduled) {
    w.i64(s.id);
    w.i64(s.start);
    w.i64(s.num_new_tokens);
    w.i64(s.num_spec_tokens);
    w.i64(s.num_logits_rows);
    w.ints<int32_t>(s.spec_token_ids);
    w.ints<int32_t>(s.spec_tree_parents);
    w.i64(s.num_steps);
  }
  w.i64(num_batched_tokens);
  w.i64(num_running_or_waiting);
  w.u64(failed.size());
  for (const auto& f : failed) {
    w.i64(f.id);
    w.u64(f.adapter_id);
    w.str(f.message);
  }
  return w.take();
}

Result<SchedulerOutput> SchedulerOutput::deserialize(std::span<const uint8_t> bytes,
                                                     const sample::GrammarCompiler& compile) {
  ByteReader r(bytes);
  SchedulerOutput out;
  VESPER_READ(magic, r.u64());
  if (magic != kMagic) return make_error("not a step plan (or another version of the format)");
  VESPER_TRY(r.ints(out.finished));
  VESPER_TRY(r.ints(out.preempted));
  VESPER_TRY(r.ints(out.recomputed));
  VESPER_READ(num_new, r.count());
  out.new_sequences.resize(num_new);
  for (auto& n : out.new_sequences) {
    VESPER_READ(id, r.i64());
    n.id = id;
    VESPER_TRY(r.ints(n.token_ids));
    VESPER_READ(num_prompt, r.i64());
    if (num_prompt < 1 || num_prompt > static_cast<int64_t>(n.token_ids.size()))
      return make_error("sequence " + std::to_string(id) + " has a prompt of " +
                        std::to_string(num_prompt) + " of its " +
                        std::to_string(n.token_ids.size()) + " tokens");
    n.num_prompt_tokens = num_prompt;
    VESPER_TRY(r.ints(n.block_table));
    VESPER_TRY(check_blocks(n.block_table, true));
    VESPER_READ(adapter, r.i64());
    if (adapter < -1 || adapter > INT32_MAX) return make_error("adapter slot out of range");
    n.adapter = static_cast<int32_t>(adapter);
    VESPER_READ(quantized, r.i64());
    if (quantized < 0 || quantized > static_cast<int64_t>(n.block_table.size()))
      return make_error("quantized groups out of range for sequence " + std::to_string(id));
    n.quantized_groups = quantized;
    auto params = std::make_shared<sample::SamplingParams>();
    if (Status st = sample::read_sampling_params(r, *params, compile); !st)
      return make_error("sequence " + std::to_string(id) + ": " + st.error().message);
    n.sampling.params = std::move(params);
    VESPER_READ(seed, r.u64());
    n.sampling.seed = seed;
  }
  VESPER_READ(num_cached, r.count());
  out.cached_sequences.resize(num_cached);
  for (auto& c : out.cached_sequences) {
    VESPER_READ(id, r.i64());
    c.id = id;
    VESPER_READ(resumed, r.boolean());
    c.resumed = resumed;
    VESPER_READ(num_tokens, r.i64());
    if (num_tokens < 1) return make_error("sequence " + std::to_string(id) + " has no tokens");
    c.num_tokens = num_tokens;
    VESPER_READ(num_blocks, r.i64());
    c.num_blocks = num_blocks;
    std::vector<int32_t> replaced;
    VESPER_TRY(r.ints(replaced));
    VESPER_TRY(check_blocks(replaced, true));
    if (replaced.size() % 2 != 0) return make_error("an odd number of replaced block ids");
    for (size_t i = 0; i < replaced.size(); i += 2)
      c.replaced_blocks.push_back({replaced[i], replaced[i + 1]});
    VESPER_TRY(r.ints(c.new_block_ids));
    VESPER_TRY(check_blocks(c.new_block_ids, true));
    if (c.num_blocks < static_cast<int64_t>(c.new_block_ids.size()) ||
        (c.resumed && c.num_blocks != static_cast<int64_t>(c.new_block_ids.size())))
      return make_error("a table of " + std::to_string(c.num_blocks) + " blocks with " +
                        std::to_string(c.new_block_ids.size()) + " new ones");
    VESPER_READ(quantized, r.i64());
    if (quantized < 0 || quantized > c.num_blocks)
      return make_error("quantized groups out of range for sequence " + std::to_string(id));
    c.quantized_groups = quantized;
    VESPER_READ(adapter, r.i64());
    if (adapter < -1 || adapter > INT32_MAX) return make_error("adapter slot out of range");
    c.adapter = static_cast<int32_t>(adapter);
  }
  VESPER_READ(num_forks, r.count());
  out.forks.resize(num_forks);
  for (auto& f : out.forks) {
    VESPER_READ(parent, r.i64());
    VESPER_READ(child, r.i64());
    VESPER_READ(seed, r.u64());
    if (parent == child) return make_error("sequence " + std::to_string(parent) + " forks itself");
    f = {parent, child, seed};
  }
  VESPER_READ(num_ops, r.count());
  out.block_ops.resize(num_ops);
  for (kv::BlockOp& op : out.block_ops) {
    VESPER_READ(kind, r.u64());
    VESPER_READ(src, r.i64());
    VESPER_READ(dst, r.i64());
    VESPER_TRY(r.ints(op.rows));
    VESPER_TRY(check_blocks(op.rows));
    if (kind > static_cast<uint64_t>(kv::BlockOp::Kind::kQuantizeGroup))
      return make_error("a block op of unknown kind " + std::to_string(kind));
    op.kind = static_cast<kv::BlockOp::Kind>(kind);
    const bool quantize = op.kind == kv::BlockOp::Kind::kQuantizeGroup;
    if (src < 0 || src > INT32_MAX || dst < 0 || dst > INT32_MAX || quantize == op.rows.empty())
      return make_error("a bad block op");
    op.src = static_cast<kv::BlockId>(src);
    op.dst = static_cast<kv::BlockId>(dst);
  }
  VESPER_READ(num_scheduled, r.count());
  out.scheduled.resize(num_scheduled);
  for (auto& s : out.scheduled) {
    VESPER_READ(id, r.i64());
    VESPER_READ(start, r.i64());
    VESPER_READ(num_new_tokens, r.i64());
    VESPER_READ(num_spec, r.i64());
    VESPER_READ(num_logits, r.i64());
    s.id = id;
    s.start = start;
    s.num_new_tokens = num_new_tokens;
    s.num_spec_tokens = num_spec;
    s.num_logits_rows = num_logits;
    VESPER_TRY(r.ints(s.spec_token_ids));
    VESPER_TRY(r.ints(s.spec_tree_parents));
    if (!s.spec_tree_parents.empty()) {
      if (static_cast<int64_t>(s.spec_tree_parents.size()) != num_spec)
        return make_error("a tree of " + std::to_string(s.spec_tree_parents.size()) +
                          " parents for " + std::to_string(num_spec) + " proposals of sequence " +
                          std::to_string(id));
      for (size_t j = 0; j < s.spec_tree_parents.size(); ++j)
        if (s.spec_tree_parents[j] < -1 || s.spec_tree_parents[j] >= static_cast<int32_t>(j))
          return make_error("proposal " + std::to_string(j) + " of sequence " + std::to_string(id) +
                            " has parent " + std::to_string(s.spec_tree_parents[j]));
    }
    VESPER_READ(num_steps, r.i64());
    s.num_steps = num_steps;
    if (start < 0 || num_new_tokens < 0 || num_spec < 0 || num_spec > num_new_tokens ||
        static_cast<int64_t>(s.spec_token_ids.size()) != num_spec ||
        (num_logits != 0 && num_logits != 1 + num_spec) || num_logits > num_new_tokens ||
        num_steps < 1 || (num_steps > 1 && (num_spec > 0 || num_logits != 1)))
      return make_error("inconsistent scheduled entry for sequence " + std::to_string(id));
  }
  VESPER_READ(batched, r.i64());
  out.num_batched_tokens = batched;
  VESPER_READ(running_or_waiting, r.i64());
  out.num_running_or_waiting = running_or_waiting;
  VESPER_READ(num_failed, r.count());
  out.failed.resize(num_failed);
  for (auto& f : out.failed) {
    VESPER_READ(id, r.i64());
    f.id = id;
    VESPER_READ(adapter_id, r.u64());
    f.adapter_id = adapter_id;
    VESPER_TRY(r.str(f.message));
  }
  if (!r.done())
    return make_error(std::to_string(bytes.size() - r.offset()) + " bytes left after the plan");
  return out;
}

bool operator==(const SamplingSetup& a, const SamplingSetup& b) {
  if (a.seed != b.seed || (a.params == nullptr) != (b.params == nullptr)) return false;
  return a.params == nullptr || sample::same_sampling_params(*a.params, *b.params);
}
bool operator==(const NewSequenceData& a, const NewSequenceData& b) {
  return a.id == b.id && a.token_ids == b.token_ids && a.num_prompt_tokens == b.num_prompt_tokens &&
         a.block_table == b.block_table && a.adapter == b.adapter &&
         a.quantized_groups == b.quantized_groups && a.sampling == b.sampling;
}
bool operator==(const BlockTableEntry& a, const BlockTableEntry& b) {
  return a.index == b.index && a.block == b.block;
}
bool operator==(const CachedSequenceData& a, const CachedSequenceData& b) {
  return a.id == b.id && a.resumed == b.resumed && a.num_tokens == b.num_tokens &&
         a.num_blocks == b.num_blocks && a.replaced_blocks == b.replaced_blocks &&
         a.new_block_ids == b.new_block_ids && a.quantized_groups == b.quantized_groups &&
         a.adapter == b.adapter;
}
bool operator==(const ForkData& a, const ForkData& b) {
  return a.parent == b.parent && a.child == b.child && a.seed == b.seed;
}
bool operator==(const ScheduledSequence& a, const ScheduledSequence& b) {
  return a.id == b.id && a.start == b.start && a.num_new_tokens == b.num_new_tokens &&
         a.num_spec_tokens == b.num_spec_tokens && a.num_logits_rows == b.num_logits_rows &&
         a.spec_token_ids == b.spec_token_ids && a.spec_tree_parents == b.spec_tree_parents &&
         a.num_steps == b.num_steps;
}
bool operator==(const FailedSequence& a, const FailedSequence& b) {
  return a.id == b.id && a.adapter_id == b.adapter_id && a.message == b.message;
}
bool operator==(const SchedulerOutput& a, const SchedulerOutput& b) {
  return a.finished == b.finished && a.preempted == b.preempted && a.recomputed == b.recomputed &&
         a.new_sequences == b.new_sequences && a.cached_sequences == b.cached_sequences &&
         a.forks == b.forks && a.block_ops == b.block_ops && a.scheduled == b.scheduled &&
         a.num_batched_tokens == b.num_batched_tokens &&
         a.num_running_or_waiting == b.num_running_or_waiting && a.failed == b.failed;
}

}  // namespace vesper::sched
