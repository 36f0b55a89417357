// sched/Scheduler under a long random workload: thousands of sequences with random prompt and
// output lengths, priorities, forks, speculative tokens (randomly accepted and rolled back) and
// aborts in every state, on a KV cache small enough to preempt often, for each preemption mode,
// with chunked prefill on and off, at several block sizes. Every step is checked by the fake engine
// (sched_driver.h: invariants, budgets, order, and the KV contents each sequence reads); the run
// must also make progress every step and end with every sequence gone and every block free.
//
// The seed is printed; set VESPER_SCHED_SEED to replay one.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "sched/sched_driver.h"

namespace vesper::sched {
namespace {

using testing::Driver;
using testing::Exit;

// One seed per run of the binary; each case mixes in its parameters.
uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("VESPER_SCHED_SEED"))
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    return (static_cast<uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  }();
  return seed;
}

// Where a sequence was when it was aborted.
enum AbortState {
  kNewWaiting,
  kPreemptedWaiting,
  kPrefilling,
  kDecoding,
  kSwappedOut,
  kNumAbortStates
};
const char* const kAbortStateNames[] = {"waiting (new)", "waiting (preempted)", "running (prefill)",
                                        "running (decode)", "swapped"};

AbortState abort_state(const Sequence& s) {
  switch (s.status) {
    case SeqStatus::kWaiting:
      return s.num_preemptions == 0 ? kNewWaiting : kPreemptedWaiting;
    case SeqStatus::kSwapped:
      return kSwappedOut;
    default:
      return s.num_uncomputed() > 1 ? kPrefilling : kDecoding;
  }
}

// Swap with a host pool large enough that it rarely fills, and with a small one, so that swap
// often falls back to recompute.
enum class Preemption { kRecompute, kSwap, kSwapSmallHost };

using Params =
    std::tuple<Preemption, bool /*chunked*/, int64_t /*block size*/, bool /*prefix caching*/>;

class SchedulerRandom : public ::testing::TestWithParam<Params> {};

TEST_P(SchedulerRandom, ThousandsOfSequencesAllFinishWithEveryStepChecked) {
  // Plain variables, not structured bindings: lambdas below capture them (clang 14 cannot
  // capture a structured binding).
  const Preemption preemption = std::get<0>(GetParam());
  const bool chunked = std::get<1>(GetParam());
  const int64_t block_size = std::get<2>(GetParam());
  const bool prefix_caching = std::get<3>(GetParam());
  const PreemptionMode mode =
      preemption == Preemption::kRecompute ? PreemptionMode::kRecompute : PreemptionMode::kSwap;
  const uint64_t seed =
      base_seed() ^ (static_cast<uint64_t>(preemption) * 1000003u + (chunked ? 7919u : 0u) +
                     static_cast<uint64_t>(block_size) * 104729u + (prefix_caching ? 31u : 0u));
  std::printf("SchedulerRandom: VESPER_SCHED_SEED=%" PRIu64 " (case seed %" PRIu64 ")\n",
              base_seed(), seed);
  SCOPED_TRACE("VESPER_SCHED_SEED=" + std::to_string(base_seed()));

  constexpr int64_t kMaxModelLen = 128;
  constexpr int64_t kDeviceTokens = 320;  // about 2.5 of the longest sequences
  const int64_t host_tokens = preemption == Preemption::kSwapSmallHost ? 64 : 256;
  constexpr int kTargetSequences = 2000;
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = chunked ? 48 : 96;
  cfg.max_num_seqs = 12;
  cfg.max_model_len = kMaxModelLen;
  cfg.enable_chunked_prefill = chunked;
  cfg.preemption_mode = mode;
  Driver d(cfg, kDeviceTokens / block_size, host_tokens / block_size, block_size, seed,
           prefix_caching);
  d.set_speculation(0.3);
  std::mt19937_64& rng = d.rng();
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };

  SeqId next_id = 1;
  int accepted = 0, rejected = 0, forks = 0;
  int aborts[kNumAbortStates] = {};
  auto submit = [&] {
    const int64_t kind = uniform(0, 99);
    int64_t prompt = kind < 70   ? uniform(1, 24)
                     : kind < 95 ? uniform(25, 80)
                                 : uniform(81, kMaxModelLen + 8);
    int64_t max_total = prompt + (chance(0.9) ? uniform(1, 48) : uniform(1, 120));
    const auto priority = static_cast<int32_t>(uniform(0, 2));
    const SeqId id = next_id++;
    // n > 1 sampling: a sibling or two forked once the prompt is computed.
    std::vector<SeqId> children;
    if (max_total > prompt + 1 && chance(0.25))
      for (int64_t k = uniform(1, 2); k > 0; --k) children.push_back(next_id++);
    const Status st = d.add(id, prompt, max_total, priority, std::nullopt, 0, children);
    const bool fits = prompt <= kMaxModelLen && max_total <= kMaxModelLen &&
                      (chunked || max_total <= cfg.max_num_batched_tokens);
    EXPECT_EQ(st.ok(), fits) << "sequence " << id << ": prompt " << prompt << ", max_total "
                             << max_total << (st.ok() ? "" : ": " + st.error().message);
    if (st.ok())
      ++accepted;
    else
      ++rejected;
  };

  const int64_t max_steps = 400000;
  int64_t idle_steps = 0;
  while ((accepted < kTargetSequences || d.sched().has_unfinished()) && d.steps() < max_steps) {
    // Arrivals in bursts, keeping a queue of a few dozen.
    if (accepted < kTargetSequences && d.live().size() < 40)
      for (int64_t k = uniform(0, 3); k > 0 && accepted < kTargetSequences; --k) submit();

    // Aborts: pick a state that is present, then a sequence in it, so every state gets its turn.
    if (!d.live().empty() && chance(0.08)) {
      std::vector<SeqId> by_state[kNumAbortStates];
      for (SeqId id : d.live()) by_state[abort_state(*d.sched().find(id))].push_back(id);
      std::vector<int> present;
      for (int st = 0; st < kNumAbortStates; ++st)
        if (!by_state[st].empty()) present.push_back(st);
      const int st = present[uniform(0, static_cast<int64_t>(present.size()) - 1)];
      const SeqId victim = by_state[st][uniform(0, static_cast<int64_t>(by_state[st].size()) - 1)];
      d.abort(victim);
      d.sched().check_invariants();
      ++aborts[st];
    }

    if (!d.sched().has_unfinished()) continue;
    const int failures = Driver::num_failures();
    const SchedulerOutput out = d.step();
    if (Driver::num_failures() != failures) break;
    forks += static_cast<int>(out.forks.size());
    // Liveness: with anything left, every step computes something.
    if (out.scheduled.empty() && d.sched().has_unfinished()) ++idle_steps;
    ASSERT_EQ(idle_steps, 0) << "step " << d.steps() << " scheduled nothing with "
                             << d.live().size() << " sequences left";
  }
  ASSERT_FALSE(HasFailure());
  ASSERT_FALSE(d.sched().has_unfinished()) << "not done after " << d.steps() << " steps";
  EXPECT_GE(accepted, kTargetSequences);
  d.expect_all_free();
  EXPECT_EQ(d.binder().pinned(), 0);

  // Every sequence left, finished or aborted; the workload exercised what it is meant to.
  int finished = 0;
  for (const auto& [id, exit] : d.exits()) finished += exit == Exit::kFinished;
  EXPECT_EQ(static_cast<int>(d.exits().size()), accepted + forks);
  EXPECT_GT(finished, accepted / 2);
  EXPECT_GT(rejected, 0);
  EXPECT_GT(forks, 0);
  // Speculation ran, and both acceptance and rollback happened.
  EXPECT_GT(d.num_spec_verified(), 0);
  EXPECT_GT(d.num_spec_accepted(), 0);
  EXPECT_LT(d.num_spec_accepted(), d.num_spec_verified());
  const SchedulerStats stats = d.sched().stats();
  EXPECT_GT(stats.num_preemptions, 100);
  if (prefix_caching) {
    EXPECT_GT(stats.prefix_cache_hits, 0);
  } else {
    EXPECT_EQ(stats.prefix_cache_queries, 0);
  }
  if (mode == PreemptionMode::kSwap) {
    EXPECT_GT(stats.num_swap_outs, 0);
  }
  const bool recomputes = preemption != Preemption::kSwap;  // the large host pool may never fill
  if (recomputes) {
    EXPECT_GT(stats.num_recomputes, 0);
  }
  for (int st = 0; st < kNumAbortStates; ++st) {
    const bool possible = (st != kSwappedOut || mode == PreemptionMode::kSwap) &&
                          (st != kPrefilling || chunked) && (st != kPreemptedWaiting || recomputes);
    if (possible) {
      EXPECT_GT(aborts[st], 0) << "no abort while " << kAbortStateNames[st];
    }
  }
  std::printf(
      "  %lld steps, %d accepted, %d rejected, %d forks, %d finished, %lld preemptions (%lld "
      "swaps, "
      "%lld recomputes), aborts: %d new, %d preempted, %d prefill, %d decode, %d swapped\n",
      static_cast<long long>(d.steps()), accepted, rejected, forks, finished,
      static_cast<long long>(stats.num_preemptions), static_cast<long long>(stats.num_swap_outs),
      static_cast<long long>(stats.num_recomputes), aborts[0], aborts[1], aborts[2], aborts[3],
      aborts[4]);
}

INSTANTIATE_TEST_SUITE_P(Modes, SchedulerRandom,
                         ::testing::Combine(::testing::Values(Preemption::kRecompute,
                                                              Preemption::kSwap,
                                                              Preemption::kSwapSmallHost),
                                            ::testing::Bool(), ::testing::Values<int64_t>(1, 4, 16),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           const Preemption p = std::get<0>(info.param);
                           return std::string(p == Preemption::kRecompute ? "Recompute"
                                              : p == Preemption::kSwap    ? "Swap"
                                                                          : "SwapSmallHost") +
                                  (std::get<1>(info.param) ? "Chunked" : "Whole") + "Block" +
                                  std::to_string(std::get<2>(info.param)) +
                                  (std::get<3>(info.param) ? "PrefixCache" : "");
                         });

}  // namespace
}  // namespace vesper::sched
