// A fake engine for scheduler tests: it drives Scheduler the way the engine loop does
// (schedule, run the step, append a sampled token where the step samples, remove finished
// sequences) and checks every step against the scheduler's contract:
//  - check_invariants(); token budget and max_num_seqs; no sequence scheduled twice;
//  - each scheduled sequence starts at its num_computed_tokens, and samples exactly when the
//    step reaches its last token; chunked prefill off: whole remainders only;
//  - a plan that schedules nothing carries no swaps, copies or preemptions (the engine skips it);
//  - preempted sequences are not scheduled, and become waiting (recompute, num_computed 0) or
//    swapped (swap mode); no swap-in and no admission in a step that preempted;
//  - stall-free: a running sequence that is skipped (neither scheduled nor preempted) implies
//    the step is full (token budget or max_num_seqs); with chunked prefill off this holds for
//    decodes;
//  - FCFS/priority: waiting sequences are admitted in served_before order without overtaking,
//    swapped ones come back in that order (and run in the step they come back), and no new
//    sequence starts while one stays swapped;
//  - copies are order-independent (no block is both a copy's source and a copy's destination,
//    no block is copied into twice), so an engine may run them as one batched kernel;
//  - the plan is self-contained: a SequenceMirror built from the plans alone holds, for every
//    scheduled sequence, exactly the scheduler's committed tokens and the KV manager's table;
//  - KV contents, from the plan and the mirror alone (as a runner in another process would): a
//    model of every device and host slot follows the step's swap-outs, swap-ins and copies, checks
//    that each scheduled sequence finds the K/V of all its computed tokens in its block table,
//    then writes the step's new tokens, speculative ones included (never into a block another
//    sequence shares). This catches lost, stale or clobbered KV however it happens, rejected
//    speculative K/V read before being overwritten among them;
//  - with speculation on (set_speculation), sampled sequences get random proposals in the fake
//    runner output; after a step verifies them a random number is accepted and the rest rolled
//    back;
//  - n > 1: a sequence added with fork ids is forked in the step that completes its prompt; the
//    children sample their first tokens from that step;
//  - adapters are pinned through a fake binder whose pins must balance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler.h"
#include "sched/sequence_mirror.h"

namespace vesper::sched::testing {

// What the KV slot of token `token` at position `pos` holds: the pair, so that slots of
// different sequences or positions are told apart.
inline int64_t kv_tag(int64_t pos, int32_t token) {
  return (pos << 32) | static_cast<int64_t>(static_cast<uint32_t>(token));
}

class KvContentModel {
 public:
  explicit KvContentModel(const kv::KvCacheManager& kv)
      : kv_(kv),
        bs_(kv.block_size()),
        device_(kv.device_pool().num_blocks() * kv.block_size(), kEmpty),
        host_(kv.host_pool().num_blocks() * kv.block_size(), kEmpty) {}

  // Runs one step's memory traffic and forward pass from the plan and the runner's mirror (already
  // updated with the plan); returns "" or what went wrong.
  std::string run_step(const SchedulerOutput& out, const SequenceMirror& mirror) {
    {
      std::set<kv::BlockId> srcs, dsts;
      for (const kv::BlockOp& op : out.block_ops) {
        if (op.kind != kv::BlockOp::Kind::kCopy) continue;
        srcs.insert(op.src);
        if (!dsts.insert(op.dst).second) return "two copies into block " + std::to_string(op.dst);
      }
      for (kv::BlockId b : dsts)
        if (srcs.count(b))
          return "block " + std::to_string(b) + " is both a copy's source and a copy's destination";
    }
    // In the plan's order, as a runner runs them.
    for (const kv::BlockOp& op : out.block_ops) {
      switch (op.kind) {
        case kv::BlockOp::Kind::kCopy:
          copy_block(device_, op.src, device_, op.dst);
          break;
        case kv::BlockOp::Kind::kSwapOut:
          copy_block(device_, op.src, host_, op.dst);
          break;
        case kv::BlockOp::Kind::kSwapIn:
          copy_block(host_, op.src, device_, op.dst);
          break;
        case kv::BlockOp::Kind::kQuantizeGroup:
          return "a group quantization in a cache without KIVI";
      }
    }
    // The forward pass writes every token's K/V of a layer before any attention of that layer
    // reads (the model's contract), so a step's writes land before its reads are checked.
    for (const auto& s : out.scheduled) {
      const SequenceMirror::Entry* seq = mirror.find(s.id);
      if (seq == nullptr)
        return "scheduled sequence " + std::to_string(s.id) + " is not in the runner's mirror";
      const auto& table = seq->block_table;
      const int64_t end = s.start + s.num_new_tokens;
      if (static_cast<int64_t>(table.size()) < kv_.blocks_for(end))
        return "sequence " + std::to_string(s.id) + " has " + std::to_string(table.size()) +
               " blocks for " + std::to_string(end) + " tokens";
      const int64_t committed_end = end - s.num_spec_tokens;
      // Children forked from the sequence in this step share its blocks as it writes them: they
      // are copies of it, and read what it writes.
      const auto forked = static_cast<int32_t>(std::count_if(
          out.forks.begin(), out.forks.end(), [&](const ForkData& f) { return f.parent == s.id; }));
      for (int64_t pos = s.start; pos < end; ++pos) {
        const kv::BlockId b = table[pos / bs_];
        // A shared block may be written only when it is a prefix-cache block: its content is fixed
        // by its tokens, so every sharer writes (or reads) the same K/V (a sequence admitted in
        // this step can share blocks another sequence fills in this step).
        if (kv_.device_pool().ref_count(b) != 1 + forked && kv_.device_pool().hash_of(b) == nullptr)
          return "sequence " + std::to_string(s.id) + " writes position " + std::to_string(pos) +
                 " into block " + std::to_string(b) + " shared by " +
                 std::to_string(kv_.device_pool().ref_count(b)) + " tables";
        const int32_t token =
            pos < committed_end ? seq->tokens[pos] : s.spec_token_ids[pos - committed_end];
        device_[b * bs_ + pos % bs_] = kv_tag(pos, token);
      }
    }
    for (const auto& s : out.scheduled) {
      const SequenceMirror::Entry* seq = mirror.find(s.id);
      const auto& table = seq->block_table;
      for (int64_t pos = 0; pos < s.start; ++pos) {
        const int64_t slot = table[pos / bs_] * bs_ + pos % bs_;
        const int64_t want = kv_tag(pos, seq->tokens[pos]);
        if (device_[slot] != want) {
          std::ostringstream msg;
          msg << "sequence " << s.id << " reads position " << pos << " from device block "
              << table[pos / bs_] << ": holds "
              << (device_[slot] == kEmpty
                      ? std::string("nothing")
                      : "pos " + std::to_string(device_[slot] >> 32) + " token " +
                            std::to_string(device_[slot] & 0xffffffff))
              << ", want token " << seq->tokens[pos];
          return msg.str();
        }
      }
    }
    return "";
  }

 private:
  static constexpr int64_t kEmpty = -1;
  void copy_block(const std::vector<int64_t>& from, kv::BlockId src, std::vector<int64_t>& to,
                  kv::BlockId dst) {
    std::copy_n(from.begin() + src * bs_, bs_, to.begin() + dst * bs_);
  }

  const kv::KvCacheManager& kv_;
  int64_t bs_;
  std::vector<int64_t> device_;
  std::vector<int64_t> host_;
};

// Finds a sequence's entry in a step's output.
inline const ScheduledSequence* find_scheduled(const SchedulerOutput& out, SeqId id) {
  for (const auto& s : out.scheduled)
    if (s.id == id) return &s;
  return nullptr;
}

// How a sequence left the scheduler.
enum class Exit { kFinished, kAborted };

// Pins adapters to slots numbered as the adapter ids (mod 1000), counting pins per slot.
class FakeBinder : public AdapterBinder {
 public:
  // Adapter `id` is read for `polls` more ready() calls (as a registry reads an evicted copy).
  void delay(uint64_t id, int polls) { polls_left_[id] = polls; }
  bool ready(uint64_t adapter_id) override {
    auto it = polls_left_.find(adapter_id);
    if (it == polls_left_.end() || it->second <= 0) return true;
    --it->second;
    return false;
  }
  Result<int32_t> pin(uint64_t adapter_id) override {
    EXPECT_TRUE(ready(adapter_id)) << "adapter " << adapter_id << " pinned before it was ready";
    const auto slot = static_cast<int32_t>(adapter_id % 1000);
    ++pins_[slot];
    return slot;
  }
  void unpin(int32_t slot) override {
    EXPECT_GT(pins_[slot], 0) << "slot " << slot << " unpinned more often than pinned";
    --pins_[slot];
  }
  int64_t pinned() const {
    int64_t n = 0;
    for (const auto& [slot, pins] : pins_) n += pins;
    return n;
  }

 private:
  std::map<int32_t, int64_t> pins_;
  std::map<uint64_t, int> polls_left_;
};

class Driver {
 public:
  // With prefix_caching, prompts start with one of a few shared prefixes, so that cached blocks
  // are actually hit.
  Driver(const SchedulerConfig& config, int64_t device_blocks, int64_t host_blocks,
         int64_t block_size, uint64_t seed = 1, bool prefix_caching = false)
      : kv_(device_blocks, host_blocks, block_size, prefix_caching),
        sched_(config, kv_),
        content_(kv_),
        rng_(seed) {
    sched_.set_adapter_binder(&binder_);
    if (prefix_caching)
      for (auto& p : prefixes_)
        for (int i = 0; i < 160; ++i) p.push_back(random_token());
  }

  kv::KvCacheManager& kv() { return kv_; }
  Scheduler& sched() { return sched_; }
  const SchedulerConfig& config() const { return sched_.config(); }
  int64_t steps() const { return steps_; }
  const std::set<SeqId>& live() const { return live_; }
  const std::map<SeqId, Exit>& exits() const { return exits_; }
  const std::vector<SchedulerOutput>& history() const { return history_; }
  void keep_history(bool keep) { keep_history_ = keep; }
  std::mt19937_64& rng() { return rng_; }

  const FakeBinder& binder() const { return binder_; }
  FakeBinder& binder() { return binder_; }

  // Speculation: each sequence a step samples (and that goes on) gets 1-4 random proposals with
  // probability `rate`; after the step that verifies them a random number of them is accepted.
  void set_speculation(double rate) { spec_rate_ = rate; }
  int64_t num_spec_proposed() const { return spec_proposed_; }
  int64_t num_spec_verified() const { return spec_verified_; }
  int64_t num_spec_accepted() const { return spec_accepted_; }

  int32_t random_token() { return static_cast<int32_t>(rng_() & 0x3fffffff); }

  // Adds a sequence with a random prompt of prompt_len tokens. arrival defaults to add order.
  // `adapter` (0: none) is the sequence's adapter id; `forks`, the ids of the parallel samples
  // forked from it once its prompt is computed.
  Status add(SeqId id, int64_t prompt_len, int64_t max_total, int32_t priority = 0,
             std::optional<int64_t> arrival = std::nullopt, uint64_t adapter = 0,
             const std::vector<SeqId>& forks = {}) {
    Sequence seq;
    seq.id = id;
    seq.adapter_id = adapter;
    for (const SeqId child : forks) seq.forks.push_back({id, child, static_cast<uint64_t>(child)});
    if (kv_.prefix_caching_enabled() && rng_() % 4 != 0) {
      const auto& prefix = prefixes_[rng_() % prefixes_.size()];
      seq.tokens.assign(
          prefix.begin(),
          prefix.begin() +
              std::min<int64_t>(prompt_len, static_cast<int64_t>(rng_() % prefix.size())));
    }
    while (seq.num_tokens() < prompt_len) seq.tokens.push_back(random_token());
    seq.num_prompt_tokens = prompt_len;
    seq.max_total_tokens = max_total;
    seq.priority = priority;
    seq.arrival = arrival.value_or(next_arrival_);
    next_arrival_ = std::max(next_arrival_, seq.arrival) + 1;
    Status st = sched_.add(std::move(seq));
    if (st.ok()) live_.insert(id);
    return st;
  }

  void abort(SeqId id) {
    sched_.remove(id);
    live_.erase(id);
    exits_[id] = Exit::kAborted;
  }

  // One engine step with every check; returns the scheduler's output.
  SchedulerOutput step() {
    struct Before {
      SeqStatus status;
      int64_t num_computed;
      int64_t num_tokens;
      bool decode;
    };
    std::map<SeqId, Before> before;
    for (SeqId id : live_) {
      const Sequence* s = sched_.find(id);
      before[id] = {s->status, s->num_computed_tokens, s->num_tokens(),
                    s->num_uncomputed() == 1 && !s->in_prefill()};
    }
    const SchedulerStats stats_before = sched_.stats();

    SchedulerOutput out = sched_.schedule();
    ++steps_;
    sched_.check_invariants();
    for (const ForkData& f : out.forks) {
      EXPECT_TRUE(find_scheduled(out, f.parent) != nullptr &&
                  find_scheduled(out, f.parent)->samples())
          << "sequence " << f.child << " forked from " << f.parent
          << " in a step that does not sample it";
      EXPECT_EQ(sched_.find(f.child)->num_computed_tokens,
                sched_.find(f.parent)->num_computed_tokens);
      live_.insert(f.child);
    }
    const SchedulerConfig& cfg = sched_.config();
    const std::string at = "step " + std::to_string(steps_) + ": ";

    // Budgets.
    int64_t tokens = 0;
    std::set<SeqId> scheduled;
    for (const auto& s : out.scheduled) {
      tokens += s.num_new_tokens;
      EXPECT_TRUE(scheduled.insert(s.id).second) << at << "sequence " << s.id << " scheduled twice";
    }
    EXPECT_EQ(tokens, out.num_batched_tokens) << at;
    EXPECT_LE(out.num_batched_tokens, cfg.max_num_batched_tokens) << at;
    EXPECT_LE(static_cast<int64_t>(out.scheduled.size()), cfg.max_num_seqs) << at;
    // The engine runs nothing for a plan that schedules nothing (Engine::step returns early), so
    // such a plan must carry no memory traffic and no preemption either.
    if (out.scheduled.empty()) {
      EXPECT_TRUE(out.block_ops.empty() && out.preempted.empty())
          << at << "an empty plan with swaps, copies or preemptions";
    }
    const bool full = out.num_batched_tokens == cfg.max_num_batched_tokens ||
                      static_cast<int64_t>(out.scheduled.size()) == cfg.max_num_seqs;

    // Each scheduled sequence.
    for (const auto& s : out.scheduled) {
      const Sequence* seq = sched_.find(s.id);
      EXPECT_NE(seq, nullptr) << at << s.id;
      if (seq == nullptr) continue;
      const Before& b = before.at(s.id);
      EXPECT_EQ(seq->status, SeqStatus::kRunning) << at << s.id;
      EXPECT_GT(s.num_new_tokens, 0) << at << s.id;
      if (b.status == SeqStatus::kWaiting && kv_.prefix_caching_enabled()) {
        // Admission may start past a prefix found in the cache: whole blocks, never the last token.
        EXPECT_EQ(s.start % kv_.block_size(), 0) << at << s.id;
        EXPECT_LT(s.start, seq->num_tokens()) << at << s.id;
      } else {
        EXPECT_EQ(s.start, b.num_computed) << at << s.id;
      }
      const int64_t committed_end = s.start + s.num_new_tokens - s.num_spec_tokens;
      EXPECT_EQ(seq->num_computed_tokens, committed_end) << at << s.id;
      EXPECT_LE(committed_end, seq->num_tokens()) << at << s.id;
      EXPECT_EQ(s.samples(), committed_end == seq->num_tokens()) << at << s.id;
      EXPECT_EQ(s.num_logits_rows, s.samples() ? 1 + s.num_spec_tokens : 0) << at << s.id;
      EXPECT_TRUE(s.num_spec_tokens == 0 || s.samples())
          << at << "speculation on a partial chunk of " << s.id;
      EXPECT_EQ(static_cast<int64_t>(s.spec_token_ids.size()), s.num_spec_tokens) << at << s.id;
      if (!cfg.enable_chunked_prefill) {
        EXPECT_EQ(committed_end, seq->num_tokens())
            << at << "chunk of " << s.id << " without chunking";
      }
    }

    // Preempted sequences.
    std::set<SeqId> preempted;
    for (SeqId id : out.preempted) {
      EXPECT_TRUE(preempted.insert(id).second) << at << "sequence " << id << " preempted twice";
      EXPECT_EQ(scheduled.count(id), 0u) << at << "sequence " << id << " preempted and scheduled";
      EXPECT_EQ(before.at(id).status, SeqStatus::kRunning) << at << id;
      const Sequence* seq = sched_.find(id);
      if (seq->status == SeqStatus::kWaiting) {
        EXPECT_EQ(seq->num_computed_tokens, 0) << at << id;
      } else {
        EXPECT_EQ(seq->status, SeqStatus::kSwapped) << at << id;
        EXPECT_EQ(cfg.preemption_mode, PreemptionMode::kSwap) << at << id;
        EXPECT_EQ(seq->num_computed_tokens, before.at(id).num_computed) << at << id;
      }
    }
    const SchedulerStats stats_after = sched_.stats();
    EXPECT_EQ(stats_after.num_preemptions - stats_before.num_preemptions,
              static_cast<int64_t>(out.preempted.size()))
        << at;
    EXPECT_EQ(stats_after.num_swap_outs + stats_after.num_recomputes, stats_after.num_preemptions)
        << at;
    if (!out.preempted.empty()) {
      EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapIn), 0)
          << at << "swap-in in a step that preempted";
    }
    if (cfg.preemption_mode == PreemptionMode::kRecompute) {
      EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapOut), 0) << at;
    }

    // Everything else: unchanged, or swapped in; skipped running sequences only in a full step.
    std::vector<const Sequence*> admitted, still_waiting, swapped_in, still_swapped;
    for (const auto& [id, b] : before) {
      const Sequence* seq = sched_.find(id);
      if (b.status == SeqStatus::kWaiting && seq->status == SeqStatus::kRunning)
        admitted.push_back(seq);
      if (b.status == SeqStatus::kWaiting && seq->status == SeqStatus::kWaiting)
        still_waiting.push_back(seq);
      if (b.status == SeqStatus::kSwapped && seq->status == SeqStatus::kRunning)
        swapped_in.push_back(seq);
      if (b.status == SeqStatus::kSwapped && seq->status == SeqStatus::kSwapped)
        still_swapped.push_back(seq);
      if (scheduled.count(id) || preempted.count(id)) continue;
      EXPECT_EQ(seq->num_computed_tokens, b.num_computed) << at << id;
      if (b.status == SeqStatus::kRunning) {
        EXPECT_EQ(seq->status, SeqStatus::kRunning) << at << id;
        if (b.decode || cfg.enable_chunked_prefill) {
          EXPECT_TRUE(full) << at << "running sequence " << id
                            << (b.decode ? " (decode)" : " (prefill)")
                            << " skipped in a step with room: " << out.num_batched_tokens
                            << " tokens, " << out.scheduled.size() << " sequences";
        }
      }
      if (b.status == SeqStatus::kWaiting) {
        EXPECT_EQ(seq->status, SeqStatus::kWaiting) << at << id;
      }
    }
    if (!out.preempted.empty()) {
      EXPECT_TRUE(admitted.empty()) << at << "admission in a step that preempted";
    }
    if (!admitted.empty() && !still_swapped.empty()) {
      ADD_FAILURE() << at << "sequence " << admitted[0]->id << " started while sequence "
                    << still_swapped[0]->id << " stays swapped out";
    }
    for (const Sequence* a : admitted)
      for (const Sequence* w : still_waiting)
        // The one overtaking allowed: a sequence without an adapter past adapter sequences that
        // --max-loras holds back.
        if (!(cfg.max_loras > 0 && a->adapter_id == 0 && w->adapter_id != 0)) {
          EXPECT_FALSE(served_before(*w, *a))
              << at << "sequence " << a->id << " (priority " << a->priority
              << ") overtook waiting sequence " << w->id << " (priority " << w->priority << ")";
        }
    for (const Sequence* a : swapped_in) {
      EXPECT_EQ(scheduled.count(a->id), 1u)
          << at << "sequence " << a->id << " swapped in but not scheduled";
    }
    for (const Sequence* a : swapped_in)
      for (const Sequence* w : still_swapped)
        EXPECT_FALSE(served_before(*w, *a))
            << at << "swapped sequence " << a->id << " overtook " << w->id;

    // The plan alone brings the runner's mirror up to date: it holds what the scheduler holds.
    const Status applied = mirror_.apply(out);
    EXPECT_TRUE(applied.ok()) << at << (applied.ok() ? "" : applied.error().message);
    for (const auto& s : out.scheduled) {
      const SequenceMirror::Entry* m = mirror_.find(s.id);
      const Sequence* seq = sched_.find(s.id);
      if (m == nullptr || seq == nullptr) continue;
      EXPECT_EQ(m->tokens, seq->tokens) << at << "the mirror's tokens of " << s.id;
      EXPECT_EQ(m->block_table, kv_.block_table(s.id)) << at << "the mirror's table of " << s.id;
    }
    // A serialized copy of the plan is the same plan.
    const auto copy = SchedulerOutput::deserialize(out.serialize());
    EXPECT_TRUE(copy.ok() && *copy == out) << at << "the plan does not survive serialization";

    // The step's memory traffic and forward pass.
    const std::string kv_error = content_.run_step(out, mirror_);
    EXPECT_EQ(kv_error, "") << at;

    // The runner's part: sampling (and verification), each fork's child from its parent's row,
    // proposals for the next step; what it samples joins its mirror.
    ModelRunnerOutput ran;
    auto sample = [&](SeqId id, int64_t num_accepted, std::span<const int32_t> kept) {
      const Sequence* seq = sched_.find(id);
      SampledSequence r;
      r.id = id;
      int64_t length = seq->num_tokens();
      for (const int32_t t : kept) {
        if (length >= seq->max_total_tokens) break;
        r.token_ids.push_back(t);
        ++length;
      }
      if (length < seq->max_total_tokens) {
        r.token_ids.push_back(random_token());
        ++length;
      }
      r.num_accepted = std::min<int64_t>(num_accepted, static_cast<int64_t>(r.token_ids.size()));
      r.finished = length >= seq->max_total_tokens;
      if (!r.finished && spec_rate_ > 0 &&
          std::uniform_real_distribution<double>(0, 1)(rng_) < spec_rate_) {
        r.proposals.resize(1 + rng_() % 4);
        for (int32_t& t : r.proposals) t = random_token();
        spec_proposed_ += static_cast<int64_t>(std::min<int64_t>(
            static_cast<int64_t>(r.proposals.size()), seq->max_total_tokens - length));
      }
      return r;
    };
    size_t next_fork = 0;
    for (const auto& s : out.scheduled) {
      if (!s.samples()) continue;
      int64_t accepted = 0;
      if (s.num_spec_tokens > 0) {
        accepted = static_cast<int64_t>(rng_() % static_cast<uint64_t>(s.num_spec_tokens + 1));
        spec_verified_ += s.num_spec_tokens;
        spec_accepted_ += accepted;
      }
      ran.sequences.push_back(
          sample(s.id, accepted, std::span(s.spec_token_ids).first(static_cast<size_t>(accepted))));
      ran.sequences.back().num_proposals = s.num_spec_tokens;
      for (; next_fork < out.forks.size() && out.forks[next_fork].parent == s.id; ++next_fork)
        ran.sequences.push_back(sample(out.forks[next_fork].child, 0, {}));
    }
    EXPECT_EQ(next_fork, out.forks.size()) << at << "forks not in the order of their parents";
    for (const SampledSequence& r : ran.sequences) mirror_.append(r.id, r.token_ids);
    sched_.update(out, ran);
    for (const SampledSequence& r : ran.sequences) {
      if (!r.finished) continue;
      EXPECT_EQ(sched_.find(r.id), nullptr) << at << "finished sequence " << r.id << " still held";
      live_.erase(r.id);
      exits_[r.id] = Exit::kFinished;
    }
    sched_.check_invariants();
    if (keep_history_) history_.push_back(out);
    return out;
  }

  // Steps until nothing is left; false if that takes more than max_steps.
  // Stops early at a step that records a failure.
  bool run_to_completion(int64_t max_steps) {
    for (int64_t i = 0; i < max_steps && sched_.has_unfinished(); ++i) {
      const int failures = num_failures();
      step();
      if (num_failures() != failures) return false;
    }
    return !sched_.has_unfinished();
  }

  static int num_failures() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  }

  // Every block back in its pool.
  void expect_all_free() const {
    EXPECT_EQ(kv_.device_pool().num_free(), kv_.device_pool().num_blocks());
    EXPECT_EQ(kv_.host_pool().num_free(), kv_.host_pool().num_blocks());
    kv_.check_invariants();
  }

 private:
  kv::KvCacheManager kv_;
  std::array<std::vector<int32_t>, 3> prefixes_;
  Scheduler sched_;
  KvContentModel content_;
  SequenceMirror mirror_;
  std::mt19937_64 rng_;
  FakeBinder binder_;
  double spec_rate_ = 0;
  int64_t spec_proposed_ = 0, spec_verified_ = 0, spec_accepted_ = 0;
  std::set<SeqId> live_;
  std::map<SeqId, Exit> exits_;
  std::vector<SchedulerOutput> history_;
  bool keep_history_ = false;
  int64_t next_arrival_ = 0;
  int64_t steps_ = 0;
};

inline bool contains(const std::vector<SeqId>& ids, SeqId id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace vesper::sched::testing
