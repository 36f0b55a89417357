#include "sched/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace vesper::sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv)
    : config_(config), kv_(kv) {}

Status Scheduler::add(Sequence seq) {
  const int64_t n = seq.num_tokens();
  if (n == 0) return make_error("the prompt is empty");
  if (n > config_.max_model_len)
    return make_error("the prompt has " + std::to_string(n) +
                      " tokens, more than --max-model-len " +
                      std::to_string(config_.max_model_len));
  if (seq.max_total_tokens < n) seq.max_total_tokens = n;
  if (seq.max_total_tokens > config_.max_model_len)
    return make_error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                      std::to_string(seq.max_total_tokens - n) + ") is " +
                      std::to_string(seq.max_total_tokens) + " tokens, more than --max-model-len " +
                      std::to_string(config_.max_model_len));
  // Lookahead slots (a draft model's proposals) come on top of the sequence's own tokens.
  const int64_t blocks = kv_.blocks_for(seq.max_total_tokens + config_.num_lookahead_slots);
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

void Scheduler::drop_from_runner(SeqId id, std::vector<SeqId>& dropped) {
  if (runner_.erase(id) != 0) dropped.push_back(id);
}

void Scheduler::preempt(Sequence& victim, SchedulerOutput& out) {
  // Undo the victim's share of this step if it was already scheduled.
  auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                         [&](const ScheduledSequence& s) { return s.id == victim.id; });
  if (it != out.scheduled.end()) {
    victim.num_computed_tokens = it->start;
    out.num_batched_tokens -= it->num_new_tokens;
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
  drop_from_runner(victim.id, out.dropped);
  // The KV manager drops the copies planned into the victim's blocks (and has a swap-out read
  // such a block from the copy's source).
  if (config_.preemption_mode == PreemptionMode::kSwap && kv_.can_swap_out(victim.id)) {
    auto moves = kv_.swap_out(victim.id, &out.block_copies);
    out.swap_out.insert(out.swap_out.end(), moves.begin(), moves.end());
    victim.status = SeqStatus::kSwapped;
    ++totals_.num_swap_outs;
    return;
  }
  kv_.free(victim.id, &out.block_copies);
  victim.num_computed_tokens = 0;
  victim.status = SeqStatus::kWaiting;
  ++totals_.num_recomputes;
}

bool Scheduler::allocate_or_preempt(Sequence& seq, int64_t num_new, int64_t& num_spec,
                                    SchedulerOutput& out) {
  for (;;) {
    auto granted = kv_.allocate_slots(seq.id, seq.num_computed_tokens, num_new + num_spec,
                                      config_.num_lookahead_slots);
    if (granted) {
      out.block_copies.insert(out.block_copies.end(), granted->copies().begin(),
                              granted->copies().end());
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
      if (s.status == SeqStatus::kRunning && (victim == nullptr || served_before(*victim, s)))
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
  const bool reaches_end = seq.num_computed_tokens + num_new == seq.num_tokens();
  s.num_logits_rows = reaches_end ? 1 + num_spec : 0;
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
  // Only committed tokens enter the prefix cache.
  kv_.cache_full_blocks(seq.id, seq.tokens, seq.num_computed_tokens, seq.prefix_root);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  out.dropped = std::move(pending_drops_);
  pending_drops_.clear();
  for (const auto& [id, copy] : pending_slot_copies_) out.slot_copies.push_back(copy);
  pending_slot_copies_.clear();
  // KIVI: running sequences' groups that their next queries read quantized become quantized
  // blocks, first (their residual blocks free up for this step's allocations).
  if (kv_.kivi())
    for (SeqId id : ordered(SeqStatus::kRunning)) {
      std::vector<kv::GroupQuantization> q =
          companion_rows_ ? kv_.compact(id, get(id).num_computed_tokens, companion_rows_(id))
                          : kv_.compact(id, get(id).num_computed_tokens);
      out.group_quantizations.insert(out.group_quantizations.end(),
                                     std::make_move_iterator(q.begin()),
                                     std::make_move_iterator(q.end()));
    }
  const int64_t budget = config_.max_num_batched_tokens;
  auto room = [&] { return budget - out.num_batched_tokens; };
  auto seats = [&] { return static_cast<int64_t>(out.scheduled.size()) < config_.max_num_seqs; };

  // 1 and 2: running sequences, those with one token to compute before those with more.
  for (const bool one_token : {true, false}) {
    for (SeqId id : ordered(SeqStatus::kRunning)) {
      Sequence& seq = get(id);
      if (seq.status != SeqStatus::kRunning) continue;  // preempted meanwhile
      const int64_t uncomputed = seq.num_uncomputed();
      if ((uncomputed <= 1) != one_token) continue;
      if (std::any_of(out.scheduled.begin(), out.scheduled.end(),
                      [&](const auto& s) { return s.id == id; }))
        continue;
      const int64_t num_new = std::min(uncomputed, room());
      if (!config_.enable_chunked_prefill && num_new < uncomputed) continue;
      if (num_new <= 0 || !seats()) continue;
      int64_t num_spec =
          num_new == uncomputed
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
      if (!adapter_fits(seq)) break;
      const int64_t num_new = std::min(seq.num_uncomputed(), room());
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < seq.num_uncomputed()) break;
      // Room for its blocks and for the tokens it computes now: swapped in without the latter, it
      // would hold blocks without running and be the next victim, swapped out again for nothing.
      if (!kv_.can_swap_in(id, seq.num_computed_tokens + num_new + config_.num_lookahead_slots))
        break;
      auto moves = kv_.swap_in(id);
      out.swap_in.insert(out.swap_in.end(), moves.begin(), moves.end());
      seq.status = SeqStatus::kRunning;
      note_adapter(seq);
      auto granted =
          kv_.allocate_slots(id, seq.num_computed_tokens, num_new, config_.num_lookahead_slots);
      VESPER_CHECK(granted.has_value(), "no blocks for swapped-in sequence %lld",
                   static_cast<long long>(id));
      out.block_copies.insert(out.block_copies.end(), granted->copies().begin(),
                              granted->copies().end());
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
      if (seq.adapter_id != 0 && (adapter_waits || !adapter_fits(seq))) {
        adapter_waits = true;
        continue;
      }
      kv::PrefixMatch match;
      if (!seq.skip_prefix_cache_read) match = kv_.match_prefix(seq.tokens, seq.prefix_root);
      const int64_t start = match.num_tokens;
      const int64_t uncomputed = seq.num_tokens() - start;
      const int64_t num_new = std::min(uncomputed, room());
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < uncomputed) break;
      auto granted = kv_.allocate_slots(id, start, num_new, config_.num_lookahead_slots, &match);
      if (!granted) break;
      out.block_copies.insert(out.block_copies.end(), granted->copies().begin(),
                              granted->copies().end());
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
  describe_for_runner(out);
  return out;
}

void Scheduler::describe_for_runner(SchedulerOutput& out) {
  for (const ScheduledSequence& s : out.scheduled) {
    const Sequence& seq = get(s.id);
    const std::vector<kv::BlockId>& table = kv_.block_table(s.id);
    auto it = runner_.find(s.id);
    if (it == runner_.end()) {
      out.new_sequences.push_back(
          NewSequenceData{s.id, seq.tokens, table, seq.adapter_id, -1, kv_.quantized_groups(s.id)});
      runner_.emplace(s.id, RunnerView{seq.num_tokens(), table});
      continue;
    }
    RunnerView& view = it->second;
    CachedSequenceData c;
    c.id = s.id;
    c.new_token_ids.assign(seq.tokens.begin() + view.num_tokens, seq.tokens.end());
    const size_t keep = std::min(view.block_table.size(), table.size());
    for (size_t i = 0; i < keep; ++i)
      if (view.block_table[i] != table[i])
        c.replaced_blocks.push_back({static_cast<int32_t>(i), table[i]});
    c.new_block_ids.assign(table.begin() + static_cast<int64_t>(keep), table.end());
    c.num_blocks = static_cast<int64_t>(table.size());
    c.quantized_groups = kv_.quantized_groups(s.id);
    view.num_tokens = seq.num_tokens();
    view.block_table = table;
    out.cached_sequences.push_back(std::move(c));
  }
}

void Scheduler::append_token(SeqId id, int32_t token) {
  Sequence& seq = get(id);
  VESPER_CHECK(seq.status == SeqStatus::kRunning,
               "append_token to sequence %lld that is not running", static_cast<long long>(id));
  VESPER_CHECK(seq.spec_in_flight.empty(),
               "append_token to sequence %lld before its verification was accepted",
               static_cast<long long>(id));
  seq.tokens.push_back(token);
  seq.spec_token_ids.clear();  // proposed for the old end
  seq.spec_tree_parents.clear();
}

void Scheduler::set_spec_tokens(SeqId id, std::vector<int32_t> tokens,
                                std::vector<int32_t> tree_parents) {
  Sequence& seq = get(id);
  VESPER_CHECK(tree_parents.empty() || tree_parents.size() == tokens.size(),
               "%zu tree parents for %zu proposals", tree_parents.size(), tokens.size());
  for (size_t j = 0; j < tree_parents.size(); ++j)
    VESPER_CHECK(tree_parents[j] >= -1 && tree_parents[j] < static_cast<int32_t>(j),
                 "proposal %zu has parent %d", j, tree_parents[j]);
  // Never more than the sequence may still grow by (for a tree, a bound on its depth: its
  // proposals also need a KV slot each).
  const auto room =
      static_cast<size_t>(std::max<int64_t>(0, seq.max_total_tokens - seq.num_tokens()));
  if (tokens.size() > room) tokens.resize(room);
  if (tree_parents.size() > room) tree_parents.resize(room);
  seq.spec_token_ids = std::move(tokens);
  seq.spec_tree_parents = std::move(tree_parents);
}

void Scheduler::accept_spec_tokens(SeqId id, int64_t num_accepted) {
  std::vector<int32_t> chain(static_cast<size_t>(std::max<int64_t>(num_accepted, 0)));
  for (size_t i = 0; i < chain.size(); ++i) chain[i] = static_cast<int32_t>(i);
  accept_spec_path(id, chain);
}

void Scheduler::accept_spec_path(SeqId id, std::span<const int32_t> path) {
  Sequence& seq = get(id);
  const auto in_flight = static_cast<int32_t>(seq.spec_in_flight.size());
  const bool tree = !seq.spec_tree_in_flight.empty();
  for (size_t i = 0; i < path.size(); ++i) {
    const int32_t node = path[i];
    const int32_t parent = i == 0 ? -1 : path[i - 1];
    VESPER_CHECK(
        node >= 0 && node < in_flight &&
            (tree ? seq.spec_tree_in_flight[node] == parent : node == static_cast<int32_t>(i)),
        "sequence %lld: accepted proposal %d (of %d) does not continue the path",
        static_cast<long long>(id), node, in_flight);
  }
  // A proposal's K/V lie in the slot of position (first proposal's) + its index; an accepted one
  // belongs at (first proposal's) + its depth. Depth <= index, and both grow along the path, so
  // copying in path order never overwrites a slot a later copy reads.
  const int64_t first = seq.num_computed_tokens;
  auto slot_of = [&](int64_t pos) { return kv_.slot(id, pos); };
  for (size_t i = 0; i < path.size(); ++i)
    if (path[i] != static_cast<int32_t>(i))
      pending_slot_copies_.push_back(
          {id, SlotCopy{slot_of(first + path[i]), slot_of(first + static_cast<int64_t>(i))}});
  // The accepted tokens' K/V were written by the step: they are committed and computed.
  for (const int32_t node : path) seq.tokens.push_back(seq.spec_in_flight[node]);
  seq.num_computed_tokens += static_cast<int64_t>(path.size());
  seq.spec_in_flight.clear();
  seq.spec_tree_in_flight.clear();
  seq.spec_tree_parents.clear();
  seq.spec_token_ids.clear();
  // The rejected ones' slots go back (the lookahead slots stay: a draft model writes its next
  // proposals there); what was accepted may fill blocks for the prefix cache.
  kv_.truncate(id, seq.num_computed_tokens + config_.num_lookahead_slots);
  kv_.cache_full_blocks(id, seq.tokens, seq.num_computed_tokens, seq.prefix_root);
}

void Scheduler::fork(SeqId parent, SeqId child) {
  Sequence copy = get(parent);
  VESPER_CHECK(copy.status == SeqStatus::kRunning, "fork of a sequence that is not running");
  VESPER_CHECK(copy.spec_in_flight.empty(), "fork of a sequence with speculative tokens in flight");
  // Checked before the KV manager shares any block: emplace below would silently keep the
  // existing sequence while the child's blocks stayed allocated under its id.
  VESPER_CHECK(sequences_.count(child) == 0, "fork into existing sequence %lld",
               static_cast<long long>(child));
  copy.id = child;
  copy.spec_token_ids.clear();
  copy.spec_tree_parents.clear();
  kv_.fork(parent, child);
  sequences_.emplace(child, std::move(copy));
}

void Scheduler::remove(SeqId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  kv_.free(id);
  drop_from_runner(id, pending_drops_);
  // Its blocks are free: nothing of it is to be moved.
  std::erase_if(pending_slot_copies_, [id](const auto& c) { return c.first == id; });
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
    VESPER_CHECK(s.num_computed_tokens >= 0 && s.num_computed_tokens <= s.num_tokens(),
                 "sequence %lld computed %lld of %lld tokens", static_cast<long long>(id),
                 static_cast<long long>(s.num_computed_tokens),
                 static_cast<long long>(s.num_tokens()));
    VESPER_CHECK(s.num_tokens() <= config_.max_model_len,
                 "sequence %lld is longer than max_model_len", static_cast<long long>(id));
    switch (s.status) {
      case SeqStatus::kRunning: {
        // Cached blocks in the table hold exactly this sequence's tokens at their position, and
        // only committed, computed (or being computed this step) positions are cached.
        kv_.check_sequence(id, s.tokens, s.num_computed_tokens);
        VESPER_CHECK(kv_.has_device_blocks(id) || s.num_computed_tokens == 0,
                     "running sequence %lld has computed tokens but no blocks",
                     static_cast<long long>(id));
        const int64_t in_kv = s.num_computed_tokens + static_cast<int64_t>(s.spec_in_flight.size());
        VESPER_CHECK(static_cast<int64_t>(kv_.block_table(id).size()) >= kv_.entries_for(id, in_kv),
                     "running sequence %lld has too few blocks", static_cast<long long>(id));
        break;
      }
      case SeqStatus::kWaiting:
        VESPER_CHECK(
            !kv_.has_device_blocks(id) && !kv_.is_swapped(id) && s.num_computed_tokens == 0,
            "waiting sequence %lld holds blocks", static_cast<long long>(id));
        VESPER_CHECK(runner_.count(id) == 0, "waiting sequence %lld is still held by the runner",
                     static_cast<long long>(id));
        break;
      case SeqStatus::kSwapped:
        VESPER_CHECK(kv_.is_swapped(id) && !kv_.has_device_blocks(id),
                     "swapped sequence %lld misplaced", static_cast<long long>(id));
        VESPER_CHECK(runner_.count(id) == 0, "swapped sequence %lld is still held by the runner",
                     static_cast<long long>(id));
        break;
      case SeqStatus::kFinished:
        VESPER_CHECK(false, "finished sequence %lld still held", static_cast<long long>(id));
    }
  }
}

}  // namespace vesper::sched
