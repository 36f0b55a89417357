#include "sched/scheduler.h"

#include <algorithm>
#include <unordered_map>

#include "core/check.h"

namespace vesper::sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv) : config_(config), kv_(kv) {}

Status Scheduler::add(Sequence seq) {
  const int64_t n = seq.num_tokens();
  if (n == 0) return make_error("the prompt is empty");
  if (n > config_.max_model_len)
    return make_error("the prompt has " + std::to_string(n) + " tokens, more than --max-model-len " +
                      std::to_string(config_.max_model_len));
  if (seq.max_total_tokens < n) seq.max_total_tokens = n;
  if (seq.max_total_tokens > config_.max_model_len)
    return make_error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                      std::to_string(seq.max_total_tokens - n) + ") is " + std::to_string(seq.max_total_tokens) +
                      " tokens, more than --max-model-len " + std::to_string(config_.max_model_len));
  const int64_t blocks = kv_.blocks_for(seq.max_total_tokens);
  if (blocks > kv_.device_pool().num_blocks())
    return make_error("the request needs up to " + std::to_string(seq.max_total_tokens) + " tokens (" +
                      std::to_string(blocks) + " KV blocks) but the whole KV cache holds " +
                      std::to_string(kv_.device_pool().num_blocks()) + " blocks of " +
                      std::to_string(kv_.block_size()) + " tokens");
  if (!config_.enable_chunked_prefill && n > config_.max_num_batched_tokens)
    return make_error("the prompt has " + std::to_string(n) + " tokens, more than --max-num-batched-tokens " +
                      std::to_string(config_.max_num_batched_tokens) + " with chunked prefill disabled");
  // Without chunked prefill, a sequence preempted by recompute must prefill its prompt and its
  // output so far in one step; one longer than the budget would then block the waiting queue for
  // good (vLLM likewise caps the sequence length at max_num_batched_tokens in this mode).
  if (!config_.enable_chunked_prefill && seq.max_total_tokens > config_.max_num_batched_tokens)
    return make_error("the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                      std::to_string(seq.max_total_tokens - n) + ") is " + std::to_string(seq.max_total_tokens) +
                      " tokens, more than --max-num-batched-tokens " +
                      std::to_string(config_.max_num_batched_tokens) +
                      " with chunked prefill disabled (a preempted sequence is recomputed in one step)");
  VESPER_CHECK(sequences_.count(seq.id) == 0, "duplicate sequence id %lld", static_cast<long long>(seq.id));
  seq.status = SeqStatus::kWaiting;
  seq.num_computed_tokens = 0;
  if (kv_.prefix_caching_enabled()) seq.prefix_root = kv::root_block_hash(seq.cache_salt);
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
  std::sort(seqs.begin(), seqs.end(), [](const Sequence* a, const Sequence* b) { return served_before(*a, *b); });
  std::vector<SeqId> ids;
  ids.reserve(seqs.size());
  for (const Sequence* s : seqs) ids.push_back(s->id);
  return ids;
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
  // Copy-on-write copies planned this step into the victim's blocks have not run yet, and the
  // engine runs swap-outs before copies. Drop them (the victim gives those blocks up), and have a
  // swap-out read such a block from the copy's source instead: the fresh block holds nothing yet,
  // while the source, shared until now, still holds the data the copy was to bring.
  std::unordered_map<kv::BlockId, kv::BlockId> copied_from;  // dst -> src
  const std::vector<kv::BlockId>& table = kv_.block_table(victim.id);
  for (const kv::BlockCopy& c : out.block_copies)
    if (std::find(table.begin(), table.end(), c.dst) != table.end()) copied_from[c.dst] = c.src;
  std::erase_if(out.block_copies, [&](const kv::BlockCopy& c) { return copied_from.count(c.dst) != 0; });
  // Blocks indexed for this step's tokens will not be computed now.
  kv_.uncache_blocks_from(victim.id, victim.num_computed_tokens);
  ++totals_.num_preemptions;
  ++victim.num_preemptions;
  out.preempted.push_back(victim.id);
  if (config_.preemption_mode == PreemptionMode::kSwap && kv_.can_swap_out(victim.id)) {
    auto moves = kv_.swap_out(victim.id);
    for (kv::SwapMapping& m : moves)
      if (auto src = copied_from.find(m.device); src != copied_from.end()) m.device = src->second;
    out.swap_out.insert(out.swap_out.end(), moves.begin(), moves.end());
    victim.status = SeqStatus::kSwapped;
    ++totals_.num_swap_outs;
    return;
  }
  kv_.free(victim.id);
  victim.num_computed_tokens = 0;
  victim.status = SeqStatus::kWaiting;
  ++totals_.num_recomputes;
}

bool Scheduler::allocate_or_preempt(Sequence& seq, int64_t num_new, SchedulerOutput& out) {
  const int64_t first = seq.num_computed_tokens;
  while (!kv_.allocate_slots(seq.id, first, first + num_new, out.block_copies)) {
    // Victim: the running sequence served last (lowest priority, latest arrival).
    Sequence* victim = nullptr;
    for (auto& [id, s] : sequences_)
      if (s.status == SeqStatus::kRunning && (victim == nullptr || served_before(*victim, s))) victim = &s;
    if (victim == nullptr || victim == &seq) {
      if (seq.status == SeqStatus::kRunning) preempt(seq, out);
      return false;
    }
    preempt(*victim, out);
  }
  return true;
}

void Scheduler::schedule_tokens(Sequence& seq, int64_t num_new, SchedulerOutput& out) {
  ScheduledSequence s;
  s.id = seq.id;
  s.start = seq.num_computed_tokens;
  s.num_new_tokens = num_new;
  s.samples = seq.num_computed_tokens + num_new == seq.num_tokens();
  seq.num_computed_tokens += num_new;
  out.scheduled.push_back(s);
  out.num_batched_tokens += num_new;
  kv_.cache_full_blocks(seq.id, seq.tokens, seq.num_computed_tokens, seq.prefix_root);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  const int64_t budget = config_.max_num_batched_tokens;
  auto room = [&] { return budget - out.num_batched_tokens; };
  auto seats = [&] { return static_cast<int64_t>(out.scheduled.size()) < config_.max_num_seqs; };

  // 1 and 2: running sequences, decodes before prefill chunks.
  for (const bool decodes : {true, false}) {
    for (SeqId id : ordered(SeqStatus::kRunning)) {
      Sequence& seq = get(id);
      if (seq.status != SeqStatus::kRunning) continue;  // preempted meanwhile
      const bool is_decode = seq.num_uncomputed() == 1 && !seq.in_prefill();
      if (is_decode != decodes) continue;
      if (std::any_of(out.scheduled.begin(), out.scheduled.end(), [&](const auto& s) { return s.id == id; })) continue;
      int64_t num_new = std::min(seq.num_uncomputed(), room());
      if (!config_.enable_chunked_prefill && num_new < seq.num_uncomputed()) continue;
      if (num_new <= 0 || !seats()) continue;
      if (!allocate_or_preempt(seq, num_new, out)) continue;
      schedule_tokens(seq, num_new, out);
    }
  }

  // 3: swapped sequences come back in order while blocks allow (not in a step that preempted).
  if (out.preempted.empty()) {
    for (SeqId id : ordered(SeqStatus::kSwapped)) {
      Sequence& seq = get(id);
      const int64_t num_new = std::min(seq.num_uncomputed(), room());
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < seq.num_uncomputed()) break;
      // Room for its blocks and for the tokens it computes now: swapped in without the latter, it
      // would hold blocks without running and be the next victim, swapped out again for nothing.
      if (!kv_.can_swap_in(id, seq.num_computed_tokens + num_new)) break;
      auto moves = kv_.swap_in(id);
      out.swap_in.insert(out.swap_in.end(), moves.begin(), moves.end());
      seq.status = SeqStatus::kRunning;
      const bool allocated =
          kv_.allocate_slots(id, seq.num_computed_tokens, seq.num_computed_tokens + num_new, out.block_copies);
      VESPER_CHECK(allocated, "no blocks for swapped-in sequence %lld", static_cast<long long>(id));
      schedule_tokens(seq, num_new, out);
    }
  }

  // 4: waiting sequences, in order; stop at the first that does not fit (FCFS, no overtaking).
  // Not while a sequence stays swapped out: it has first claim on the blocks that come free, else
  // new sequences keep taking them and it can starve (vLLM V0 likewise starts no prefill while
  // any sequence is swapped).
  const bool any_swapped = std::any_of(sequences_.begin(), sequences_.end(),
                                       [](const auto& entry) { return entry.second.status == SeqStatus::kSwapped; });
  if (out.preempted.empty() && !any_swapped && kv_.device_pool().num_free() > 0) {
    for (SeqId id : ordered(SeqStatus::kWaiting)) {
      Sequence& seq = get(id);
      kv::PrefixMatch match;
      if (!seq.skip_prefix_cache_read) match = kv_.match_prefix(seq.tokens, seq.prefix_root);
      const int64_t start = match.num_tokens;
      const int64_t uncomputed = seq.num_tokens() - start;
      const int64_t num_new = std::min(uncomputed, room());
      if (num_new <= 0 || !seats()) break;
      if (!config_.enable_chunked_prefill && num_new < uncomputed) break;
      if (!kv_.allocate_slots(id, start, start + num_new, out.block_copies, &match)) break;
      seq.num_computed_tokens = start;
      if (kv_.prefix_caching_enabled()) {
        totals_.prefix_cache_queries += seq.num_tokens();
        totals_.prefix_cache_hits += start;
      }
      seq.status = SeqStatus::kRunning;
      schedule_tokens(seq, num_new, out);
    }
  }
  return out;
}

void Scheduler::append_token(SeqId id, int32_t token) {
  Sequence& seq = get(id);
  VESPER_CHECK(seq.status == SeqStatus::kRunning, "append_token to sequence %lld that is not running",
               static_cast<long long>(id));
  seq.tokens.push_back(token);
}

void Scheduler::fork(SeqId parent, SeqId child) {
  Sequence copy = get(parent);
  VESPER_CHECK(copy.status == SeqStatus::kRunning, "fork of a sequence that is not running");
  // Checked before the KV manager shares any block: emplace below would silently keep the
  // existing sequence while the child's blocks stayed allocated under its id.
  VESPER_CHECK(sequences_.count(child) == 0, "fork into existing sequence %lld", static_cast<long long>(child));
  copy.id = child;
  kv_.fork(parent, child);
  sequences_.emplace(child, std::move(copy));
}

void Scheduler::remove(SeqId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  kv_.free(id);
  sequences_.erase(it);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = totals_;
  for (const auto& [id, seq] : sequences_) {
    if (seq.status == SeqStatus::kRunning) ++s.num_running;
    else if (seq.status == SeqStatus::kWaiting) ++s.num_waiting;
    else if (seq.status == SeqStatus::kSwapped) ++s.num_swapped;
  }
  return s;
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  for (const auto& [id, s] : sequences_) {
    VESPER_CHECK(s.num_computed_tokens >= 0 && s.num_computed_tokens <= s.num_tokens(),
                 "sequence %lld computed %lld of %lld tokens", static_cast<long long>(id),
                 static_cast<long long>(s.num_computed_tokens), static_cast<long long>(s.num_tokens()));
    VESPER_CHECK(s.num_tokens() <= config_.max_model_len, "sequence %lld is longer than max_model_len",
                 static_cast<long long>(id));
    switch (s.status) {
      case SeqStatus::kRunning: {
        // Cached blocks in the table hold exactly this sequence's tokens at their position, and
        // only computed (or being computed this step) positions are cached.
        const std::vector<kv::BlockId>& table = kv_.block_table(id);
        const int64_t bs = kv_.block_size();
        VESPER_CHECK(static_cast<int64_t>(kv_.block_hashes(id).size()) * bs <= s.num_computed_tokens,
                     "running sequence %lld has hashed blocks past its computed tokens", static_cast<long long>(id));
        for (size_t i = 0; i < table.size(); ++i) {
          const std::span<const int32_t> cached = kv_.device_pool().tokens_of(table[i]);
          if (cached.empty()) continue;
          VESPER_CHECK(static_cast<int64_t>((i + 1) * bs) <= s.num_tokens() &&
                           std::equal(cached.begin(), cached.end(), s.tokens.begin() + static_cast<int64_t>(i) * bs),
                       "running sequence %lld: cached block %d at position %zu holds other tokens",
                       static_cast<long long>(id), table[i], i);
        }
        VESPER_CHECK(kv_.has_device_blocks(id) || s.num_computed_tokens == 0,
                     "running sequence %lld has computed tokens but no blocks", static_cast<long long>(id));
        VESPER_CHECK(static_cast<int64_t>(kv_.block_table(id).size()) >= kv_.blocks_for(s.num_computed_tokens),
                     "running sequence %lld has too few blocks", static_cast<long long>(id));
        break;
      }
      case SeqStatus::kWaiting:
        VESPER_CHECK(!kv_.has_device_blocks(id) && !kv_.is_swapped(id) && s.num_computed_tokens == 0,
                     "waiting sequence %lld holds blocks", static_cast<long long>(id));
        break;
      case SeqStatus::kSwapped:
        VESPER_CHECK(kv_.is_swapped(id) && !kv_.has_device_blocks(id), "swapped sequence %lld misplaced",
                     static_cast<long long>(id));
        break;
      case SeqStatus::kFinished:
        VESPER_CHECK(false, "finished sequence %lld still held", static_cast<long long>(id));
    }
  }
}

}  // namespace vesper::sched
