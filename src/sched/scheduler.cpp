#include "sched/scheduler.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace vesper::sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv)
    : config_(config), kv_(kv) {}

namespace {
// Sampling parameters for a sequence added without any (tests of the scheduler alone).
const std::shared_ptr<const sample::SamplingParams>& default_params() {
  static const auto params = std::make_shared<const sample::SamplingParams>();
  return params;
}

// An allocation's copy-on-write copies, appended to the plan's ops.
void add_copies(const kv::KvAllocation& granted, SchedulerOutput& out) {
  for (const kv::BlockCopy& c : granted.copies()) out.block_ops.push_back(kv::BlockOp::copy(c));
}
}  // namespace

Status Scheduler::add(Sequence seq) {
  const int64_t n = seq.num_tokens();
  if (n == 0) return make_error("the prompt is empty");
  if (n > config_.max_model_len)
    return make_error("the prompt has " + std::to_string(n) +
                      " tokens, more than --max-model-len " +
                      std::to_string(config_.max_model_len));
  if (seq.max_total_tokens < n) seq.max_total_tokens = n;
  if (config_.virtual_engines > 1) {
    // The set with the fewest sequences (the lowest of equals).
    std::vector<int64_t> load(static_cast<size_t>(config_.virtual_engines), 0);
    for (const auto& [id, other] : sequences_) ++load[static_cast<size_t>(other.virtual_engine)];
    seq.virtual_engine =
        static_cast<int32_t>(std::min_element(load.begin(), load.end()) - load.begin());
  }
  if (seq.max_total_tokens > config_.max_model_len)
    return make_error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                      std::to_string(seq.max_total_tokens - n) + ") is " +
                      std::to_string(seq.max_total_tokens) + " tokens, more than --max-model-len " +
                      std::to_string(config_.max_model_len));
  // Lookahead slots (a draft model's proposals) come on top of the sequence's own tokens. With
  // sinks + window, a sequence holds at most its prompt's blocks (prefilled densely), or its
  // sinks', its window's and a step's chunk of output (chunk_limit: at most a window) beside
  // them.
  int64_t peak_tokens = seq.max_total_tokens;
  if (const backend::KvSparsity w = sparsity_of(seq);
      w.windowed() && config_.enable_chunked_prefill)
    peak_tokens =
        std::min(peak_tokens, std::max(n, w.sink_tokens + 2 * w.window + 2 * kv_.block_size()));
  const int64_t blocks = kv_.blocks_for(peak_tokens + config_.num_lookahead_slots);
  if (blocks > kv_.num_device_blocks())
    return make_error("the request needs up to " + std::to_string(seq.max_total_tokens) +
                      " tokens (" + std::to_string(blocks) +
                      " KV blocks) but the whole KV cache holds " +
                      std::to_string(kv_.num_device_blocks()) + " blocks of " +
                      std::to_string(kv_.block_size()) + " tokens");
  if (!config_.enable_chunked_prefill && n > config_.max_num_batched_tokens)
    return make_error(
        "the prompt has " + std::to_string(n) + " tokens, more than --max-num-batched-tokens " +
        std::to_string(config_.max_num_batched_tokens) + " with chunked prefill disabled");
  // Without chunked prefill, a sequence preempted by recompute must prefill its prompt and its
  // output so far in one step; one longer than the budget would then block the waiting queue for
  // good (vLLM likewise caps the sequence length at max_num_batched_tokens in this mode).
  if (!config_.enable_chunked_prefill && seq.max_total_tokens > config_.max_num_batched_tokens)
    return make_error(
        "the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
        std::to_string(seq.max_total_tokens - n) + ") is " + std::to_string(seq.max_total_tokens) +
        " tokens, more than --max-num-batched-tokens " +
        std::to_string(config_.max_num_batched_tokens) +
        " with chunked prefill disabled (a preempted sequence is recomputed in one step)");
  VESPER_CHECK(sequences_.count(seq.id) == 0, "duplicate sequence id %lld",
               static_cast<long long>(seq.id));
  seq.status = SeqStatus::kWaiting;
  seq.num_computed_tokens = 0;
  seq.spec_in_flight.clear();
  seq.companion_rows = 0;
  seq.adapter_slot = -1;
  seq.num_output_placeholders = 0;
  seq.spec_token_ids.clear();
  seq.spec_tree_parents.clear();
  seq.spec_tree_in_flight.clear();
  if (seq.sampling.params == nullptr) seq.sampling.params = default_params();
  if (kv_.prefix_caching_enabled())
    seq.prefix_root = kv::root_block_hash(seq.cache_salt, seq.adapter_id);
  sequences_.emplace(seq.id, std::move(seq));
  return {};
}

Sequence& Scheduler::get(SeqId id) {
  auto it = sequences_.find(id);
  VESPER_CHECK(it != sequences_.end(), "unknown sequence %lld", static_cast<long long>(id));
  return it->second;
}

const Sequence* Scheduler::find(SeqId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : &it->second;
}

std::vector<SeqId> Scheduler::ordered(SeqStatus status) const {
  std::vector<const Sequence*> seqs;
  for (const auto& [id, s] : sequences_)
    if (s.status == status) seqs.push_back(&s);
  std::sort(seqs.begin(), seqs.end(),
            [](const Sequence* a, const Sequence* b) { return served_before(*a, *b); });
  std::vector<SeqId> ids;
  ids.reserve(seqs.size());
  for (const Sequence* s : seqs) ids.push_back(s->id);
  return ids;
}

void Scheduler::release_from_runner(SeqId id) {
  auto it = runner_.find(id);
  if (it == runner_.end()) return;
  it->second.resident = false;
  it->second.block_table.clear();
  tables_changed_.erase(id);
  if (Sequence& seq = get(id); seq.adapter_slot >= 0) {
    pending_unpins_.emplace_back(epoch_, seq.adapter_slot);
    seq.adapter_slot = -1;
  }
}

void Scheduler::forget_in_runner(SeqId id) {
  auto it = runner_.find(id);
  if (it == runner_.end()) return;
  if (it->second.resident) release_from_runner(id);
  runner_.erase(it);
  pending_finished_.push_back(id);
}

void Scheduler::release_unpins() {
  // A slot released while the plan of schedule() call e was made (or after it) may be read by
  // plans up to e; those have all run once max_plans_in_flight later calls have begun.
  while (!pending_unpins_.empty() &&
         pending_unpins_.front().first <= epoch_ - config_.max_plans_in_flight) {
    if (binder_ != nullptr) binder_->unpin(pending_unpins_.front().second);
    pending_unpins_.pop_front();
  }
}

void Scheduler::preempt(Sequence& victim, SchedulerOutput& out) {
  // Undo the victim's share of this step if it was already scheduled.
  auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                         [&](const ScheduledSequence& s) { return s.id == victim.id; });
  if (it != out.scheduled.end()) {
    victim.num_computed_tokens = it->start;
    out.num_batched_tokens -= it->num_new_tokens;
    if (it->samples()) --victim.num_output_placeholders;  // it will not sample in this step
    out.scheduled.erase(it);
  }
  victim.spec_in_flight.clear();
  victim.spec_token_ids.clear();
  victim.spec_tree_in_flight.clear();
  victim.spec_tree_parents.clear();
  // Blocks indexed for this step's tokens will not be computed now.
  kv_.uncache_blocks_from(victim.id, victim.num_computed_tokens);
  ++totals_.num_preemptions;
  ++victim.num_preemptions;
  out.preempted.push_back(victim.id);
  release_from_runner(victim.id);
  // A swap-out reads the victim's blocks after the copies planned into them (the plan's ops run
  // in order); freeing drops those copies.
  if (config_.preemption_mode == PreemptionMode::kSwap && kv_.can_swap_out(victim.id)) {
    for (const kv::SwapMapping& m : kv_.swap_out(victim.id))
      out.block_ops.push_back(kv::BlockOp::swap_out(m));
    victim.status = SeqStatus::kSwapped;
    ++totals_.num_swap_outs;
    return;
  }
  kv_.free(victim.id, &out.block_ops);
  victim.num_computed_tokens = 0;
  victim.companion_rows = 0;  // a draft's rows went with the blocks
  victim.status = SeqStatus::kWaiting;
  out.recomputed.push_back(victim.id);
  ++totals_.num_recomputes;
}

bool Scheduler::allocate_or_preempt(Sequence& seq, int64_t num_new, int64_t& num_spec,
                                    SchedulerOutput& out) {
  for (;;) {
    auto granted = kv_.allocate_slots(seq.id, seq.num_computed_tokens, num_new + num_spec,
                                      config_.num_lookahead_slots);
    if (granted) {
      add_copies(*granted, out);
      return true;
    }
    // Speculation is optional: without room for the proposals, the sequence computes its own
    // token this step rather than push anyone out.
    if (num_spec > 0) {
      num_spec = 0;
      continue;
    }
    // Victim: the running sequence served last (lowest priority, latest arrival).
    Sequence* victim = nullptr;
    for (auto& [id, s] : sequences_)
      if (s.status == SeqStatus::kRunning && scheduling_now(s) &&
          (victim == nullptr || served_before(*victim, s)))
        victim = &s;
    if (victim == nullptr || victim == &seq) {
      if (seq.status == SeqStatus::kRunning) preempt(seq, out);
      return false;
    }
    preempt(*victim, out);
  }
}

void Scheduler::schedule_tokens(Sequence& seq, int64_t num_new, int64_t num_spec,
                                SchedulerOutput& out) {
  ScheduledSequence s;
  s.id = seq.id;
  s.start = seq.num_computed_tokens;
  s.num_new_tokens = num_new + num_spec;
  s.num_spec_tokens = num_spec;
  const bool reaches_end = seq.num_computed_tokens + num_new == seq.num_tokens_planned();
  s.num_logits_rows = reaches_end ? 1 + num_spec : 0;
  // The token it samples is known once update() reads the runner's output.
  if (reaches_end) ++seq.num_output_placeholders;
  s.spec_token_ids.assign(seq.spec_token_ids.begin(), seq.spec_token_ids.begin() + num_spec);
  // A prefix of a tree's proposals is a tree (parents come first).
  if (!seq.spec_tree_parents.empty() && num_spec > 0)
    s.spec_tree_parents.assign(seq.spec_tree_parents.begin(),
                               seq.spec_tree_parents.begin() + num_spec);
  seq.spec_in_flight = s.spec_token_ids;
  seq.spec_tree_in_flight = s.spec_tree_parents;
  seq.num_computed_tokens += num_new;
  out.num_batched_tokens += s.num_new_tokens;
  out.scheduled.push_back(std::move(s));
  // Only committed tokens enter the prefix cache (and placeholders once update() knows them).
  // With sinks + window only the prompt's: an output's K/V come from windowed attention, which a
  // later request computing the same tokens as its prompt (densely) would not give.
  int64_t cacheable = std::min(seq.num_computed_tokens, seq.num_tokens());
  if (sparsity_of(seq).enabled()) cacheable = std::min(cacheable, seq.num_prompt_tokens);
  kv_.cache_full_blocks(seq.id, seq.tokens, cacheable, seq.prefix_root);
}

int64_t Scheduler::chunk_limit(const Sequence& seq, int64_t start) const {
  const backend::KvSparsity w = sparsity_of(seq);
  if (!w.windowed() || !config_.enable_chunked_prefill) return std::numeric_limits<int64_t>::max();
  return start < seq.num_prompt_tokens ? seq.num_prompt_tokens - start : w.window;
}

backend::KvSparsity Scheduler::sparsity_of(const Sequence& seq) const {
  return config_.kv_sparsity.for_sequence(seq.num_prompt_tokens,
                                          seq.sampling.params && seq.sampling.params->kv_dense);
}

void Scheduler::fail(Sequence& seq, std::string message, SchedulerOutput& out) {
  const SeqId id = seq.id;
  kv_.free(id, &out.block_ops);
  if (runner_.count(id) != 0) {
    runner_.erase(id);
    tables_changed_.erase(id);
    out.finished.push_back(id);
  }
  out.failed.push_back({id, seq.adapter_id, std::move(message)});
  sequences_.erase(id);
}

bool Scheduler::adapter_ready(const Sequence& seq) {
  if (seq.adapter_id == 0 || binder_ == nullptr || binder_->ready(seq.adapter_id)) return true;
  waited_on_adapter_ = true;
  return false;
}

bool Scheduler::bind_adapter(Sequence& seq, SchedulerOutput& out) {
  if (seq.adapter_id == 0) return true;
  Result<int32_t> slot = binder_ != nullptr ? binder_->pin(seq.adapter_id)
                                            : Result<int32_t>(make_error("no adapters are loaded"));
  if (slot) {
    seq.adapter_slot = *slot;
    return true;
  }
  fail(seq, slot.error().message, out);
  return false;
}

SchedulerOutput Scheduler::schedule() {
  ++epoch_;
  waited_on_adapter_ = false;
  release_unpins();
  SchedulerOutput out;
  out.finished = std::move(pending_finished_);
  pending_finished_.clear();
  // Running sequences' tables take the shape their KV layout wants before anything is
  // allocated (KIVI: groups their next queries read quantized become quantized blocks), so the
  // blocks this frees serve this step's allocations.
  for (SeqId id : ordered(SeqStatus::kRunning)) {
    const Sequence& seq = get(id);
    const int64_t written = config_.compaction_waits_for_companion
                                ? seq.companion_rows
                                : std::numeric_limits<int64_t>::max();
    if (kv_.prepare_step(id, seq.num_computed_tokens, written, sparsity_of(seq), out.block_ops))
      tables_changed_.insert(id);
  }
  const int64_t budget = config_.max_num_batched_tokens;
  auto room = [&] { return budget - out.num_batched_tokens; };
  auto seats = [&] { return static_cast<int64_t>(out.scheduled.size()) < config_.max_num_seqs; };

  // 1 and 2: running sequences, those with one token to compute before those with more.
  for (const bool one_token : {true, false}) {
    for (SeqId id : ordered(SeqStatus::kRunning)) {
      Sequence& seq = get(id);
      if (seq.status != SeqStatus::kRunning) continue;  // preempted meanwhile
      if (!scheduling_now(seq)) continue;
      const int64_t uncomputed = seq.num_uncomputed();
      if ((uncomputed <= 1) != one_token) continue;
      // The step in flight samples its last token: nothing more to compute.
      if (seq.num_output_placeholders > 0 && seq.num_tokens_planned() >= seq.max_total_tokens)
        continue;
      if (std::any_of(out.scheduled.begin(), out.scheduled.end(),
                      [&](const auto& s) { return s.id == id; }))
        continue;
      const int64_t num_new =
          std::min({uncomputed, room(), chunk_limit(seq, seq.num_computed_tokens)});
      if (!config_.enable_chunked_prefill && num_new < uncomputed) continue;
      if (num_new <= 0 || !seats()) continue;
      // Proposals follow the committed tokens: none while a sampled token is still unknown.
      int64_t num_spec =
          num_new == uncomputed && seq.num_output_placeholders == 0
              ? std::min<int64_t>(static_cast<int64_t>(seq.spec_token_ids.size()), room() - num_new)
              : 0;
      if (!allocate_or_preempt(seq, num_new, num_spec, out)) continue;
      schedule_tokens(seq, num_new, num_spec, out);
    }
  }

  // Adapters of the running sequences, for --max-loras: a sequence may start (or come back)
  // when its adapter is among them or there is room for one more.
  std::vector<uint64_t> active_adapters;
  for (const auto& [id, seq] : sequences_)
    if (seq.status == SeqStatus::kRunning && seq.adapter_id != 0 &&
        std::find(active_adapters.begin(), active_adapters.end(), seq.adapter_id) ==
            active_adapters.end())
      active_adapters.push_back(seq.adapter_id);
  auto adapter_fits = [&](const Sequence& seq) {
    return seq.adapter_id == 0 || config_.max_loras <= 0 ||
           std::find(active_adapters.begin(), active_adapters.end(), seq.adapter_id) !=
               active_adapters.end() ||
           static_cast<int64_t>(active_adapters.size()) < config_.max_loras;
  };
  auto note_adapter = [&](const Sequence& seq) {
    if (seq.adapter_id != 0 && std::find(active_adapters.begin(), active_adapters.end(),
                                         seq.adapter_id) == active_adapters.end())
      active_adapters.push_back(seq.adapter_id);
  };

  // 3: swapped sequences come back in order while blocks allow (not in a step that preempted).
  if (out.preempted.empty()) {
    for (SeqId id : ordered(SeqStatus::kSwapped)) {
      Sequence& seq = get(id);
      if (!scheduling_now(seq)) continue;
      // Its tokens must be known to come back (async scheduling: the step that preempted it may
      // not have been read yet).
      if (!adapter_fits(seq) || seq.num_output_placeholders > 0) break;
      if (!adapter_ready(seq)) break;
      const int64_t num_new =
          std::min({seq.num_uncomputed(), room(), chunk_limit(seq, seq.num_computed_tokens)});
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < seq.num_uncomputed()) break;
      // Room for its blocks and for the tokens it computes now: swapped in without the latter, it
      // would hold blocks without running and be the next victim, swapped out again for nothing.
      if (!kv_.can_swap_in(id, seq.num_computed_tokens + num_new + config_.num_lookahead_slots))
        break;
      if (!bind_adapter(seq, out)) continue;
      for (const kv::SwapMapping& m : kv_.swap_in(id))
        out.block_ops.push_back(kv::BlockOp::swap_in(m));
      seq.status = SeqStatus::kRunning;
      note_adapter(seq);
      auto granted =
          kv_.allocate_slots(id, seq.num_computed_tokens, num_new, config_.num_lookahead_slots);
      VESPER_CHECK(granted.has_value(), "no blocks for swapped-in sequence %lld",
                   static_cast<long long>(id));
      add_copies(*granted, out);
      schedule_tokens(seq, num_new, 0, out);
    }
  }

  // 4: waiting sequences, in order; stop at the first that does not fit (FCFS, no overtaking).
  // Not while a sequence stays swapped out: it has first claim on the blocks that come free, else
  // new sequences keep taking them and it can starve (vLLM V0 likewise starts no prefill while
  // any sequence is swapped).
  const bool any_swapped = std::any_of(sequences_.begin(), sequences_.end(), [](const auto& entry) {
    return entry.second.status == SeqStatus::kSwapped;
  });
  if (out.preempted.empty() && !any_swapped && kv_.num_free_device_blocks() > 0) {
    bool adapter_waits = false;  // an adapter sequence waits for --max-loras: later ones too
    for (SeqId id : ordered(SeqStatus::kWaiting)) {
      Sequence& seq = get(id);
      if (!scheduling_now(seq)) continue;
      if (seq.num_output_placeholders > 0) break;  // preempted with a token not read yet
      if (seq.adapter_id != 0 && (adapter_waits || !adapter_fits(seq) || !adapter_ready(seq))) {
        adapter_waits = true;
        continue;
      }
      kv::PrefixMatch match;
      if (!seq.skip_prefix_cache_read) match = kv_.match_prefix(seq.tokens, seq.prefix_root);
      const int64_t start = match.num_tokens;
      const int64_t uncomputed = seq.num_tokens() - start;
      const int64_t num_new = std::min({uncomputed, room(), chunk_limit(seq, start)});
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < uncomputed) break;
      auto granted = kv_.allocate_slots(id, start, num_new, config_.num_lookahead_slots, &match);
      if (!granted) break;
      add_copies(*granted, out);
      // Its adapter's file no longer reads: the blocks just granted go back, the request ends.
      if (!bind_adapter(seq, out)) continue;
      seq.num_computed_tokens = start;
      if (kv_.prefix_caching_enabled()) {
        totals_.prefix_cache_queries += seq.num_tokens();
        totals_.prefix_cache_hits += start;
      }
      seq.status = SeqStatus::kRunning;
      note_adapter(seq);
      schedule_tokens(seq, num_new, 0, out);
    }
  }
  if (config_.num_scheduler_steps > 1) extend_to_multi_step(out);
  fork_samples(out);
  describe_for_runner(out);
  for (const auto& [id, seq] : sequences_)
    if (seq.status != SeqStatus::kSwapped) ++out.num_running_or_waiting;
  return out;
}

void Scheduler::extend_to_multi_step(SchedulerOutput& out) {
  if (out.scheduled.empty()) return;
  for (const ScheduledSequence& s : out.scheduled) {
    const Sequence& seq = get(s.id);
    const bool decode = s.num_new_tokens == 1 && s.num_spec_tokens == 0 && s.samples() &&
                        s.start >= seq.num_prompt_tokens && seq.forks.empty();
    if (!decode) return;  // a step with prompt work (or proposals) runs single-step
  }
  for (ScheduledSequence& s : out.scheduled) {
    Sequence& seq = get(s.id);
    // The entry computes position start and samples the token after; each further pass computes
    // the token the pass before sampled. Never past max_tokens; as far as free blocks allow (no
    // one is preempted for it).
    int64_t steps = std::min(config_.num_scheduler_steps,
                             seq.max_total_tokens - (seq.num_tokens_planned() - 1));
    for (; steps > 1; --steps)
      if (auto granted = kv_.allocate_slots(s.id, s.start, steps, config_.num_lookahead_slots)) {
        add_copies(*granted, out);
        break;
      }
    if (steps <= 1) continue;
    s.num_steps = steps;
    seq.num_computed_tokens += steps - 1;
    seq.num_output_placeholders += steps - 1;
  }
}

void Scheduler::fork_samples(SchedulerOutput& out) {
  for (const ScheduledSequence& s : out.scheduled) {
    if (!s.samples()) continue;
    Sequence& parent = get(s.id);
    if (parent.forks.empty()) continue;
    const std::vector<ForkData> forks = std::move(parent.forks);
    parent.forks.clear();
    for (const ForkData& f : forks) {
      // Checked before the KV manager shares any block: emplace below would silently keep the
      // existing sequence while the child's blocks stayed allocated under its id.
      VESPER_CHECK(sequences_.count(f.child) == 0, "fork into existing sequence %lld",
                   static_cast<long long>(f.child));
      Sequence child = parent;
      child.id = f.child;
      child.sampling.seed = f.seed;
      child.spec_token_ids.clear();
      child.spec_tree_parents.clear();
      child.spec_in_flight.clear();
      child.spec_tree_in_flight.clear();
      child.adapter_slot = -1;
      if (child.adapter_id != 0) {
        // The parent's copy is pinned, so this pin finds it loaded.
        auto slot = binder_->pin(child.adapter_id);
        VESPER_CHECK(slot.ok(), "a pinned adapter failed to pin again: %s",
                     slot.ok() ? "" : slot.error().message.c_str());
        child.adapter_slot = *slot;
      }
      kv_.fork(parent.id, child.id);
      // The runner copies the parent as this plan leaves it.
      runner_[child.id] = RunnerView{true, child.num_tokens(), kv_.block_table(parent.id)};
      out.forks.push_back(f);
      sequences_.emplace(child.id, std::move(child));
    }
  }
}

void Scheduler::describe_for_runner(SchedulerOutput& out) {
  auto describe = [&](SeqId id) {
    const Sequence& seq = get(id);
    const std::vector<kv::BlockId>& table = kv_.block_table(id);
    auto it = runner_.find(id);
    if (it == runner_.end()) {
      out.new_sequences.push_back(NewSequenceData{id, seq.tokens, seq.num_prompt_tokens, table,
                                                  seq.adapter_slot, kv_.quantized_groups(id),
                                                  seq.sampling});
      runner_.emplace(id, RunnerView{true, seq.num_tokens(), table});
      return;
    }
    RunnerView& view = it->second;
    CachedSequenceData c;
    c.id = id;
    c.resumed = !view.resident;
    c.num_tokens = seq.num_tokens();
    const size_t keep = c.resumed ? 0 : std::min(view.block_table.size(), table.size());
    for (size_t i = 0; i < keep; ++i)
      if (view.block_table[i] != table[i])
        c.replaced_blocks.push_back({static_cast<int32_t>(i), table[i]});
    c.new_block_ids.assign(table.begin() + static_cast<int64_t>(keep), table.end());
    c.num_blocks = static_cast<int64_t>(table.size());
    c.quantized_groups = kv_.quantized_groups(id);
    c.adapter = seq.adapter_slot;
    view.resident = true;
    view.num_tokens = seq.num_tokens();
    view.block_table = table;
    out.cached_sequences.push_back(std::move(c));
  };
  for (const ScheduledSequence& s : out.scheduled) {
    describe(s.id);
    tables_changed_.erase(s.id);
  }
  // Resident sequences the plan does not schedule whose tables changed (KIVI compaction,
  // proposals' slots given back): the runner's copy stays exact.
  for (const SeqId id : tables_changed_) {
    auto it = runner_.find(id);
    if (it != runner_.end() && it->second.resident && it->second.block_table != kv_.block_table(id))
      describe(id);
  }
  tables_changed_.clear();
}

void Scheduler::set_spec_tokens(Sequence& seq, std::span<const int32_t> tokens,
                                std::span<const int32_t> tree_parents) {
  VESPER_CHECK(tree_parents.empty() || tree_parents.size() == tokens.size(),
               "%zu tree parents for %zu proposals", tree_parents.size(), tokens.size());
  for (size_t j = 0; j < tree_parents.size(); ++j)
    VESPER_CHECK(tree_parents[j] >= -1 && tree_parents[j] < static_cast<int32_t>(j),
                 "proposal %zu has parent %d", j, tree_parents[j]);
  // Never more than the sequence may still grow by (for a tree, a bound on its depth: its
  // proposals also need a KV slot each).
  const auto room =
      static_cast<size_t>(std::max<int64_t>(0, seq.max_total_tokens - seq.num_tokens()));
  seq.spec_token_ids.assign(tokens.begin(), tokens.begin() + std::min(tokens.size(), room));
  seq.spec_tree_parents.assign(tree_parents.begin(),
                               tree_parents.begin() + std::min(tree_parents.size(), room));
}

void Scheduler::commit(Sequence& seq, int64_t num_accepted, std::span<const int32_t> tokens,
                       bool finishing) {
  const auto in_flight = static_cast<int64_t>(seq.spec_in_flight.size());
  VESPER_CHECK(num_accepted >= 0 && num_accepted <= in_flight,
               "sequence %lld: %lld of %lld proposals accepted", static_cast<long long>(seq.id),
               static_cast<long long>(num_accepted), static_cast<long long>(in_flight));
  // A stop among the kept proposals cut the tokens there: those kept are computed.
  num_accepted = std::min(num_accepted, static_cast<int64_t>(tokens.size()));
  seq.tokens.insert(seq.tokens.end(), tokens.begin(), tokens.end());
  seq.spec_token_ids.clear();  // proposed for the old end
  seq.spec_tree_parents.clear();
  // A sequence that ends here indexes nothing more: output processing may still cut it earlier
  // (a stop string), and tokens past that cut are kept out of the prefix cache.
  if (in_flight == 0) {
    // Tokens computed in this plan's later passes (multi-step) are known now: their blocks may
    // be full.
    if (seq.status == SeqStatus::kRunning && !finishing)
      kv_.cache_full_blocks(seq.id, seq.tokens, std::min(seq.num_computed_tokens, seq.num_tokens()),
                            seq.prefix_root);
    return;
  }
  // The kept proposals' K/V were written by the step (the runner moved a tree path's to the slots
  // of its positions): they are committed and computed. The rejected ones' slots go back (the
  // lookahead slots stay: a draft model writes its next proposals there); what was kept may fill
  // blocks for the prefix cache.
  seq.num_computed_tokens += num_accepted;
  seq.spec_in_flight.clear();
  seq.spec_tree_in_flight.clear();
  kv_.truncate(seq.id, seq.num_computed_tokens + config_.num_lookahead_slots);
  tables_changed_.insert(seq.id);
  if (!finishing)
    kv_.cache_full_blocks(seq.id, seq.tokens, seq.num_computed_tokens, seq.prefix_root);
}

void Scheduler::update(const SchedulerOutput& plan, const ModelRunnerOutput& output) {
  // The plan's samples are known now: their placeholders give way to the tokens below (a sequence
  // the runner ended early gets fewer, and leaves).
  for (const ScheduledSequence& s : plan.scheduled)
    if (s.samples())
      if (auto it = sequences_.find(s.id); it != sequences_.end())
        it->second.num_output_placeholders -= s.num_steps;
  for (const ForkData& f : plan.forks)
    if (auto it = sequences_.find(f.child); it != sequences_.end())
      --it->second.num_output_placeholders;
  for (const SampledSequence& r : output.sequences) {
    auto it = sequences_.find(r.id);
    if (it == sequences_.end()) continue;  // removed meanwhile (aborted, stopped by text)
    Sequence& seq = it->second;
    // With async scheduling the plan made meanwhile may have preempted it: its tokens count all
    // the same (it recomputes them, or its swapped blocks hold their K/V but the last).
    VESPER_CHECK(seq.status == SeqStatus::kRunning || config_.max_plans_in_flight > 1,
                 "sequence %lld sampled while not running", static_cast<long long>(r.id));
    commit(seq, r.num_accepted, r.token_ids, r.finished);
    if (r.finished) {
      remove(r.id);
      continue;
    }
    if (r.companion_rows >= 0) seq.companion_rows = r.companion_rows;
    set_spec_tokens(seq, r.proposals, r.proposal_parents);
  }
}

void Scheduler::remove(SeqId id, int64_t num_valid_tokens) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  if (num_valid_tokens >= 0) kv_.uncache_blocks_from(id, num_valid_tokens);
  forget_in_runner(id);
  kv_.free(id);
  sequences_.erase(it);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = totals_;
  for (const auto& [id, seq] : sequences_) {
    if (seq.status == SeqStatus::kRunning)
      ++s.num_running;
    else if (seq.status == SeqStatus::kWaiting)
      ++s.num_waiting;
    else if (seq.status == SeqStatus::kSwapped)
      ++s.num_swapped;
  }
  return s;
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  for (const auto& [id, s] : sequences_) {
    VESPER_CHECK(s.num_computed_tokens >= 0 && s.num_computed_tokens <= s.num_tokens_planned() &&
                     s.num_output_placeholders >= 0,
                 "sequence %lld computed %lld of %lld tokens (%lld placeholders)",
                 static_cast<long long>(id), static_cast<long long>(s.num_computed_tokens),
                 static_cast<long long>(s.num_tokens()),
                 static_cast<long long>(s.num_output_placeholders));
    VESPER_CHECK(s.num_tokens() <= config_.max_model_len,
                 "sequence %lld is longer than max_model_len", static_cast<long long>(id));
    auto view = runner_.find(id);
    const bool resident = view != runner_.end() && view->second.resident;
    switch (s.status) {
      case SeqStatus::kRunning: {
        // Cached blocks in the table hold exactly this sequence's tokens at their position, and
        // only committed, computed (or being computed this step) positions are cached.
        kv_.check_sequence(id, s.tokens, std::min(s.num_computed_tokens, s.num_tokens()));
        VESPER_CHECK(kv_.has_device_blocks(id) || s.num_computed_tokens == 0,
                     "running sequence %lld has computed tokens but no blocks",
                     static_cast<long long>(id));
        const int64_t in_kv = s.num_computed_tokens + static_cast<int64_t>(s.spec_in_flight.size());
        VESPER_CHECK(static_cast<int64_t>(kv_.block_table(id).size()) >= kv_.entries_for(id, in_kv),
                     "running sequence %lld has too few blocks", static_cast<long long>(id));
        VESPER_CHECK(resident, "running sequence %lld is not resident in the runner",
                     static_cast<long long>(id));
        VESPER_CHECK((s.adapter_id != 0) == (s.adapter_slot >= 0),
                     "running sequence %lld: adapter %llu, slot %d", static_cast<long long>(id),
                     static_cast<unsigned long long>(s.adapter_id), s.adapter_slot);
        break;
      }
      case SeqStatus::kWaiting:
        VESPER_CHECK(
            !kv_.has_device_blocks(id) && !kv_.is_swapped(id) && s.num_computed_tokens == 0,
            "waiting sequence %lld holds blocks", static_cast<long long>(id));
        VESPER_CHECK(!resident && s.adapter_slot < 0,
                     "waiting sequence %lld is still resident in the runner",
                     static_cast<long long>(id));
        break;
      case SeqStatus::kSwapped:
        VESPER_CHECK(kv_.is_swapped(id) && !kv_.has_device_blocks(id),
                     "swapped sequence %lld misplaced", static_cast<long long>(id));
        VESPER_CHECK(!resident && s.adapter_slot < 0,
                     "swapped sequence %lld is still resident in the runner",
                     static_cast<long long>(id));
        break;
      case SeqStatus::kFinished:
        VESPER_CHECK(false, "finished sequence %lld still held", static_cast<long long>(id));
    }
  }
  for (const auto& [id, view] : runner_)
    VESPER_CHECK(sequences_.count(id) != 0, "the runner holds forgotten sequence %lld",
                 static_cast<long long>(id));
}

}  // namespace vesper::sched
