// sched/Scheduler with virtual engines (SchedulerConfig::virtual_engines, a pipeline's leader):
// driven as the engine's pipelined loop drives it, with plan k made before the outputs of plans
// k - 1 and k - 2 are read, every plan must hold only its set's sequences (so never one the plan
// before it holds), preempt only its own, and every sequence must still finish with all its
// tokens, in a roomy KV pool and in one small enough to preempt.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>

#include "kv/kv_cache_manager.h"
#include "sched/scheduler.h"

namespace vesper::sched {
namespace {

struct PipelinedRun {
  int64_t plans = 0;
  int64_t preemptions = 0;
  std::map<SeqId, int64_t> generated;
};

PipelinedRun run_pipelined(int64_t device_blocks, int64_t num_seqs) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 8;
  c.max_model_len = 64;
  c.virtual_engines = 2;
  c.max_plans_in_flight = 3;
  kv::KvCacheManager kv(device_blocks, 0, 4, false);
  Scheduler s(c, kv);
  std::map<SeqId, int32_t> set_of;
  for (SeqId id = 1; id <= num_seqs; ++id) {
    Sequence seq;
    seq.id = id;
    seq.tokens.assign(static_cast<size_t>(5 + id % 4), static_cast<int32_t>(id));
    seq.num_prompt_tokens = seq.num_tokens();
    seq.max_total_tokens = seq.num_tokens() + 6 + id % 3;
    seq.arrival = id;
    EXPECT_TRUE(s.add(seq).ok());
    set_of[id] = s.find(id)->virtual_engine;
  }
  // Arrivals alternate between the sets (each goes to the one with fewer sequences).
  for (const auto& [id, set] : set_of) EXPECT_EQ(set, (id - 1) % 2) << "sequence " << id;

  PipelinedRun run;
  std::deque<SchedulerOutput> in_flight;
  auto read_oldest = [&] {
    const SchedulerOutput plan = std::move(in_flight.front());
    in_flight.pop_front();
    ModelRunnerOutput out;
    for (const ScheduledSequence& e : plan.scheduled) {
      if (!e.samples()) continue;
      const Sequence* seq = s.find(e.id);
      if (seq == nullptr) continue;
      SampledSequence r;
      r.id = e.id;
      r.token_ids = {7};
      r.finished = seq->num_tokens() + 1 >= seq->max_total_tokens;
      ++run.generated[e.id];
      out.sequences.push_back(r);
    }
    s.update(plan, out);
  };
  for (int64_t k = 0; k < 400 && (s.has_unfinished() || !in_flight.empty()); ++k) {
    SchedulerOutput plan = s.schedule();
    const int32_t turn = static_cast<int32_t>((k + 1) % 2);  // schedule() call k + 1
    for (const ScheduledSequence& e : plan.scheduled) {
      EXPECT_EQ(set_of.at(e.id), turn) << "plan " << k << " schedules sequence " << e.id;
      if (!in_flight.empty()) {
        for (const ScheduledSequence& before : in_flight.back().scheduled)
          EXPECT_NE(before.id, e.id) << "plans " << k - 1 << " and " << k << " both hold it";
      }
    }
    for (const SeqId id : plan.preempted)
      EXPECT_EQ(set_of.at(id), turn) << "plan " << k << " preempts sequence " << id;
    run.preemptions += static_cast<int64_t>(plan.preempted.size());
    ++run.plans;
    in_flight.push_back(std::move(plan));
    if (in_flight.size() == 3) read_oldest();
    s.check_invariants();
  }
  while (!in_flight.empty()) read_oldest();
  EXPECT_FALSE(s.has_unfinished());
  for (SeqId id = 1; id <= num_seqs; ++id)
    EXPECT_GE(run.generated[id], 6 + id % 3) << "sequence " << id << " did not finish";
  return run;
}

TEST(SchedulerVirtualEngines, PlansTakeTheSetsInTurnAndEverySequenceFinishes) {
  const PipelinedRun run = run_pipelined(64, 10);
  EXPECT_EQ(run.preemptions, 0);
}

TEST(SchedulerVirtualEngines, APlanPreemptsOnlyItsOwnSetsSequences) {
  // 8 blocks of 4 tokens for 10 sequences of up to 17 tokens: preemptions are certain.
  const PipelinedRun run = run_pipelined(8, 10);
  EXPECT_GT(run.preemptions, 0);
}

}  // namespace
}  // namespace vesper::sched
