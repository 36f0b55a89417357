// sched/Scheduler: admission checks, budgets, chunked prefill, FCFS and priorities,
// preemption by recompute and by swap, removal in every state, and forks. Each test drives the
// scheduler through the fake engine in sched_driver.h, which checks every step's contract and
// the KV contents the step would read.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "sched/sched_driver.h"

namespace vesper::sched {
namespace {

using testing::contains;
using testing::Driver;
using testing::Exit;
using testing::find_scheduled;

SchedulerConfig make_config(int64_t budget, int64_t max_seqs, int64_t max_model_len, bool chunked,
                            PreemptionMode mode = PreemptionMode::kRecompute) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = max_model_len;
  c.enable_chunked_prefill = chunked;
  c.preemption_mode = mode;
  return c;
}

::testing::AssertionResult has_error(const Status& st, const std::vector<std::string>& parts) {
  if (st.ok()) return ::testing::AssertionFailure() << "accepted";
  for (const auto& p : parts)
    if (st.error().message.find(p) == std::string::npos)
      return ::testing::AssertionFailure()
             << "message \"" << st.error().message << "\" lacks \"" << p << "\"";
  return ::testing::AssertionSuccess() << st.error().message;
}

// ---------------------------------------------------------------------------------------------
// Admission

TEST(Scheduler, RejectsAnEmptyPrompt) {
  Driver d(make_config(64, 8, 64, true), 16, 0, 4);
  EXPECT_TRUE(has_error(d.add(1, 0, 10), {"empty"}));
  EXPECT_EQ(d.sched().find(1), nullptr);
  EXPECT_FALSE(d.sched().has_unfinished());
}

TEST(Scheduler, RejectsAPromptLongerThanMaxModelLen) {
  Driver d(make_config(256, 8, 64, true), 64, 0, 4);
  EXPECT_TRUE(has_error(d.add(1, 65, 70), {"65 tokens", "--max-model-len 64"}));
  EXPECT_EQ(d.sched().find(1), nullptr);
  EXPECT_EQ(d.sched().stats().num_waiting, 0);
  EXPECT_TRUE(d.add(2, 64, 64).ok());
}

TEST(Scheduler, RejectsMaxTotalTokensOverMaxModelLen) {
  Driver d(make_config(256, 8, 64, true), 64, 0, 4);
  EXPECT_TRUE(has_error(d.add(1, 10, 65), {"65 tokens", "max_tokens (55)", "--max-model-len 64"}));
  EXPECT_EQ(d.sched().find(1), nullptr);
  EXPECT_TRUE(d.add(2, 10, 64).ok());
  // A max_total below the prompt's length means the prompt alone.
  EXPECT_TRUE(d.add(3, 10, 0).ok());
  EXPECT_EQ(d.sched().find(3)->max_total_tokens, 10);
}

TEST(Scheduler, RejectsASequenceNeedingMoreBlocksThanTheWholeCache) {
  Driver d(make_config(256, 8, 256, true), 4, 8, 4);  // 16 tokens of KV
  EXPECT_TRUE(has_error(d.add(1, 10, 17), {"17 tokens", "5 KV blocks", "4 blocks of 4 tokens"}));
  EXPECT_TRUE(has_error(d.add(2, 17, 17), {"5 KV blocks"}));
  EXPECT_EQ(d.sched().find(1), nullptr);
  EXPECT_EQ(d.sched().find(2), nullptr);
  ASSERT_TRUE(d.add(3, 10, 16).ok());  // exactly the whole cache
  EXPECT_TRUE(d.run_to_completion(100));
  EXPECT_EQ(d.exits().at(3), Exit::kFinished);
  d.expect_all_free();
}

TEST(Scheduler, WithoutChunkedPrefillRejectsPromptsOverTheTokenBudget) {
  Driver off(make_config(16, 8, 64, false), 64, 0, 4);
  EXPECT_TRUE(has_error(off.add(1, 17, 17),
                        {"17 tokens", "--max-num-batched-tokens 16", "chunked prefill"}));
  EXPECT_EQ(off.sched().find(1), nullptr);
  EXPECT_TRUE(off.add(2, 16, 16).ok());
  Driver on(make_config(16, 8, 64, true), 64, 0, 4);
  EXPECT_TRUE(on.add(1, 17, 17).ok());
}

// Without chunked prefill a sequence preempted by recompute must prefill its prompt and its
// output so far in one step, so nothing longer than the budget can be admitted: it would block
// the waiting queue for good after its first preemption.
TEST(Scheduler, WithoutChunkedPrefillEveryPreemptedSequenceCanBeRecomputed) {
  for (auto mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    SCOPED_TRACE(mode == PreemptionMode::kSwap ? "swap" : "recompute");
    Driver d(make_config(16, 8, 64, false, mode), 12, 2, 2);  // 24 tokens of KV, 4 on the host
    // Every fifth sequence could grow past the budget: rejected, naming the limit.
    std::vector<SeqId> accepted;
    for (SeqId id = 1; id <= 40; ++id) {
      const int64_t max_total = id % 5 == 0 ? 17 + id % 4 : 9 + id % 8;
      const Status st = d.add(id, 1 + id % 8, max_total, static_cast<int32_t>(id % 2));
      if (id % 5 == 0) {
        EXPECT_TRUE(
            has_error(st, {std::to_string(max_total) + " tokens", "--max-num-batched-tokens 16"}))
            << id;
      } else {
        EXPECT_TRUE(st.ok()) << id;
      }
      if (st.ok()) accepted.push_back(id);
    }
    ASSERT_TRUE(d.run_to_completion(2000)) << "stuck after " << d.steps() << " steps";
    EXPECT_GT(d.sched().stats().num_recomputes, 0);
    for (SeqId id : accepted) EXPECT_EQ(d.exits().at(id), Exit::kFinished) << id;
    d.expect_all_free();
  }
}

// ---------------------------------------------------------------------------------------------
// Budgets and chunked prefill

TEST(Scheduler, OneSequencePrefillsThenDecodesToCompletion) {
  Driver d(make_config(64, 8, 64, true), 16, 0, 4);
  ASSERT_TRUE(d.add(1, 10, 14).ok());
  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].start, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  EXPECT_TRUE(out.scheduled[0].samples());
  EXPECT_EQ(out.num_batched_tokens, 10);
  EXPECT_EQ(d.kv().block_table(1).size(), 3u);
  for (int64_t pos = 10; pos < 13; ++pos) {
    out = d.step();
    ASSERT_EQ(out.scheduled.size(), 1u);
    EXPECT_EQ(out.scheduled[0].start, pos);
    EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
    EXPECT_TRUE(out.scheduled[0].samples());
  }
  EXPECT_FALSE(d.sched().has_unfinished());
  EXPECT_EQ(d.exits().at(1), Exit::kFinished);
  EXPECT_TRUE(d.step().empty());
  d.expect_all_free();
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptAcrossSteps) {
  Driver d(make_config(16, 8, 64, true), 16, 0, 4);
  ASSERT_TRUE(d.add(1, 40, 42).ok());
  const std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 16}, {16, 16}, {32, 8}, {40, 1}};
  const std::vector<size_t> blocks = {4, 8, 10, 11};
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto out = d.step();
    ASSERT_EQ(out.scheduled.size(), 1u) << i;
    EXPECT_EQ(out.scheduled[0].start, chunks[i].first) << i;
    EXPECT_EQ(out.scheduled[0].num_new_tokens, chunks[i].second) << i;
    EXPECT_EQ(out.scheduled[0].samples(), i >= 2) << i;  // only the chunk reaching the end samples
    if (d.sched().find(1) != nullptr) {
      EXPECT_EQ(d.kv().block_table(1).size(), blocks[i]) << i;
    }
  }
  EXPECT_FALSE(d.sched().has_unfinished());
  d.expect_all_free();
}

TEST(Scheduler, RunningDecodesAreScheduledEveryStepWhileALongPromptIsChunked) {
  Driver d(make_config(8, 8, 128, true), 64, 0, 4);
  ASSERT_TRUE(d.add(1, 3, 60).ok());
  ASSERT_TRUE(d.add(2, 3, 60).ok());
  d.step();  // both prompts in one step
  ASSERT_TRUE(d.add(3, 50, 52).ok());
  int64_t prefilled = 0;
  int steps = 0;
  while (prefilled < 50) {
    auto out = d.step();
    ++steps;
    ASSERT_GE(out.scheduled.size(), 3u);
    // Decodes first, one token each, then the chunk takes the rest of the budget.
    EXPECT_EQ(out.scheduled[0].id, 1);
    EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
    EXPECT_EQ(out.scheduled[1].id, 2);
    EXPECT_EQ(out.scheduled[1].num_new_tokens, 1);
    EXPECT_EQ(out.scheduled[2].id, 3);
    EXPECT_EQ(out.scheduled[2].start, prefilled);
    EXPECT_EQ(out.scheduled[2].num_new_tokens, std::min<int64_t>(6, 50 - prefilled));
    prefilled += out.scheduled[2].num_new_tokens;
    EXPECT_LE(out.num_batched_tokens, 8);
  }
  EXPECT_EQ(steps, 9);  // ceil(50 / 6)
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

TEST(Scheduler, TokenBudgetIsSharedByDecodesChunksAndNewPrompts) {
  Driver d(make_config(10, 8, 64, true), 32, 0, 4);
  for (SeqId id = 1; id <= 3; ++id) ASSERT_TRUE(d.add(id, 6, 20).ok());
  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 6);
  EXPECT_EQ(out.scheduled[1].id, 2);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 4);
  EXPECT_FALSE(out.scheduled[1].samples());
  EXPECT_EQ(out.num_batched_tokens, 10);
  EXPECT_EQ(d.sched().find(3)->status, SeqStatus::kWaiting);
  out = d.step();
  ASSERT_EQ(out.scheduled.size(), 3u);
  EXPECT_EQ(out.scheduled[0].id, 1);  // decode
  EXPECT_EQ(out.scheduled[1].id, 2);  // the rest of its prompt
  EXPECT_EQ(out.scheduled[1].start, 4);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 2);
  EXPECT_TRUE(out.scheduled[1].samples());
  EXPECT_EQ(out.scheduled[2].id, 3);  // the whole new prompt fits in the remaining 7
  EXPECT_EQ(out.scheduled[2].num_new_tokens, 6);
  EXPECT_EQ(out.num_batched_tokens, 9);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

TEST(Scheduler, MaxNumSeqsCapsEveryStep) {
  Driver d(make_config(100, 2, 64, true), 32, 0, 4);
  for (SeqId id = 1; id <= 5; ++id) ASSERT_TRUE(d.add(id, 5, 7).ok());
  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(out.scheduled[1].id, 2);
  EXPECT_EQ(d.sched().stats().num_waiting, 3);
  out = d.step();  // the two decodes take both seats
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(d.sched().stats().num_waiting, 3);
  out = d.step();  // 1 and 2 finished
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].id, 3);
  EXPECT_EQ(out.scheduled[1].id, 4);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

TEST(Scheduler, WithoutChunkedPrefillPromptsRunWholeAndInOrder) {
  Driver d(make_config(16, 8, 64, false), 32, 0, 4);
  ASSERT_TRUE(d.add(1, 10, 14).ok());
  ASSERT_TRUE(d.add(2, 10, 14).ok());
  ASSERT_TRUE(d.add(3, 4, 8).ok());
  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 1u);  // 2 does not fit whole; 3 may not overtake it
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  out = d.step();
  ASSERT_EQ(out.scheduled.size(), 3u);
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(out.scheduled[1].id, 2);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 10);
  EXPECT_EQ(out.scheduled[2].id, 3);
  EXPECT_EQ(out.scheduled[2].num_new_tokens, 4);
  EXPECT_EQ(out.num_batched_tokens, 15);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

// ---------------------------------------------------------------------------------------------
// Ordering

std::vector<SeqId> first_scheduled_order(Driver& d, int64_t max_steps) {
  std::vector<SeqId> order;
  for (int64_t i = 0; i < max_steps && d.sched().has_unfinished(); ++i) {
    auto out = d.step();
    for (const auto& s : out.scheduled)
      if (s.start == 0) order.push_back(s.id);
  }
  return order;
}

TEST(Scheduler, ServesFirstComeFirstServedWithinAPriority) {
  Driver d(make_config(64, 1, 64, true), 32, 0, 4);
  const std::vector<int64_t> arrivals = {50, 10, 40, 20, 30};
  for (SeqId id = 1; id <= 5; ++id) ASSERT_TRUE(d.add(id, 4, 7, 0, arrivals[id - 1]).ok());
  EXPECT_EQ(first_scheduled_order(d, 100), (std::vector<SeqId>{2, 4, 5, 3, 1}));
  EXPECT_FALSE(d.sched().has_unfinished());
  d.expect_all_free();
}

TEST(Scheduler, ServesLowerPriorityValuesFirst) {
  Driver d(make_config(64, 1, 64, true), 32, 0, 4);
  const std::vector<int32_t> priorities = {3, 1, 2, 1, -1};
  for (SeqId id = 1; id <= 5; ++id) ASSERT_TRUE(d.add(id, 4, 7, priorities[id - 1]).ok());
  EXPECT_EQ(first_scheduled_order(d, 100), (std::vector<SeqId>{5, 2, 4, 3, 1}));
  d.expect_all_free();
}

TEST(Scheduler, WaitingSequencesDoNotOvertakeOneThatDoesNotFit) {
  Driver d(make_config(64, 8, 64, true), 6, 0, 4);  // 24 tokens of KV
  ASSERT_TRUE(d.add(1, 16, 20).ok());               // 4 blocks
  d.step();
  ASSERT_TRUE(d.add(2, 12, 16).ok());  // needs 3 blocks, 2 free (the driver checks no overtaking)
  ASSERT_TRUE(d.add(3, 4, 5).ok());    // would fit
  auto out = d.step();
  EXPECT_EQ(find_scheduled(out, 2), nullptr);
  EXPECT_EQ(find_scheduled(out, 3), nullptr);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

// ---------------------------------------------------------------------------------------------
// Preemption

// Four one-block prompts fill a four-block cache; each first decode needs a new block.
// X (priority 0), Y (1), Z (1, later), W (0, latest).
void fill_four(Driver& d, int64_t max_total_xw = 8, int64_t max_total_yz = 8) {
  ASSERT_TRUE(d.add(1, 4, max_total_xw, 0).ok());  // X
  ASSERT_TRUE(d.add(2, 4, max_total_yz, 1).ok());  // Y
  ASSERT_TRUE(d.add(3, 4, max_total_yz, 1).ok());  // Z
  ASSERT_TRUE(d.add(4, 4, max_total_xw, 0).ok());  // W
  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 4u);
  // Priority order: X, W, Y, Z.
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(out.scheduled[1].id, 4);
  EXPECT_EQ(out.scheduled[2].id, 2);
  EXPECT_EQ(out.scheduled[3].id, 3);
  ASSERT_EQ(d.kv().device_pool().num_free(), 0);
}

TEST(Scheduler, RecomputePreemptionTakesTheLowestPriorityLatestArrivalFirst) {
  Driver d(make_config(64, 8, 64, true), 4, 0, 4);
  d.keep_history(true);
  fill_four(d);
  auto out = d.step();
  // X needs a block: Z goes (priority 1, later than Y). W needs one: Y goes.
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{3, 2}));
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(out.scheduled[1].id, 4);
  EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapOut), 0);
  for (SeqId id : {2, 3}) {
    const Sequence* s = d.sched().find(id);
    EXPECT_EQ(s->status, SeqStatus::kWaiting);
    EXPECT_EQ(s->num_computed_tokens, 0);
    EXPECT_EQ(s->num_tokens(), 5);  // prompt plus the sampled token, all to recompute
    EXPECT_EQ(s->num_preemptions, 1);
    EXPECT_FALSE(d.kv().has_device_blocks(id));
  }
  EXPECT_EQ(d.sched().stats().num_preemptions, 2);
  EXPECT_EQ(d.sched().stats().num_recomputes, 2);
  EXPECT_EQ(d.sched().stats().num_swap_outs, 0);
  ASSERT_TRUE(d.run_to_completion(200));
  // Each victim's next turn recomputes prompt and output in one go, from position 0.
  for (SeqId id : {2, 3}) {
    bool seen = false;
    for (size_t i = 2; i < d.history().size() && !seen; ++i)
      if (const auto* s = find_scheduled(d.history()[i], id)) {
        EXPECT_EQ(s->start, 0) << id;
        EXPECT_EQ(s->num_new_tokens, 5) << id;
        EXPECT_TRUE(s->samples()) << id;
        seen = true;
      }
    EXPECT_TRUE(seen) << id;
    EXPECT_EQ(d.exits().at(id), Exit::kFinished);
  }
  d.expect_all_free();
}

TEST(Scheduler, APrefillChunkPreemptsADecodeOfLowerPriorityScheduledEarlierInTheStep) {
  Driver d(make_config(8, 8, 64, true), 4, 0, 4);
  ASSERT_TRUE(d.add(1, 4, 16, 1).ok());  // low priority, decoding
  d.step();
  ASSERT_TRUE(d.add(2, 14, 16, 0).ok());  // high priority, long prompt
  d.step();                               // 1 decodes (new block), 2 gets 7 tokens: 2 blocks
  ASSERT_EQ(d.kv().device_pool().num_free(), 0);
  auto out = d.step();  // 1 decodes first, then 2's chunk needs blocks and preempts 1
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{1}));
  EXPECT_EQ(find_scheduled(out, 1), nullptr);
  ASSERT_NE(find_scheduled(out, 2), nullptr);
  EXPECT_EQ(find_scheduled(out, 2)->num_new_tokens, 7);
  EXPECT_EQ(out.num_batched_tokens, 7);  // 1's token was taken back out of the budget
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

TEST(Scheduler, TheSequenceServedLastPreemptsItself) {
  Driver d(make_config(64, 8, 64, true), 3, 0, 4);
  d.keep_history(true);
  ASSERT_TRUE(d.add(1, 3, 8, 0).ok());   // one block, room for its decodes
  ASSERT_TRUE(d.add(2, 8, 12, 1).ok());  // two full blocks: its first decode needs a third
  d.step();
  auto out = d.step();
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{2}));
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].id, 1);
  EXPECT_EQ(d.sched().find(2)->status, SeqStatus::kWaiting);
  ASSERT_TRUE(d.run_to_completion(200));
  EXPECT_EQ(d.exits().at(2), Exit::kFinished);
  d.expect_all_free();
}

TEST(Scheduler, SwapPreemptionSwapsOutAndBackInWithoutRecompute) {
  Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 8, 4);
  d.keep_history(true);
  fill_four(d);
  auto out = d.step();
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{3, 2}));
  ASSERT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapOut), 2);
  for (SeqId id : {2, 3}) {
    const Sequence* s = d.sched().find(id);
    EXPECT_EQ(s->status, SeqStatus::kSwapped);
    EXPECT_EQ(s->num_computed_tokens, 4);
    EXPECT_TRUE(d.kv().is_swapped(id));
  }
  EXPECT_EQ(d.kv().host_pool().num_free(), 6);
  EXPECT_EQ(d.sched().stats().num_swap_outs, 2);
  EXPECT_EQ(d.sched().stats().num_swapped, 2);
  const size_t preempt_step = d.history().size();
  ASSERT_TRUE(d.run_to_completion(200));
  // Y comes back before Z, each continuing from position 4 in the step it is swapped in.
  size_t back[4] = {0, 0, 0, 0};
  for (SeqId id : {2, 3}) {
    for (size_t i = preempt_step; i < d.history().size(); ++i)
      if (const auto* s = find_scheduled(d.history()[i], id)) {
        EXPECT_EQ(s->start, 4) << id;
        EXPECT_EQ(s->num_new_tokens, 1) << id;
        EXPECT_GT(kv::count_block_ops(d.history()[i].block_ops, kv::BlockOp::Kind::kSwapIn), 0)
            << id;
        back[id] = i;
        break;
      }
    EXPECT_GT(back[id], 0u) << id;
    EXPECT_EQ(d.exits().at(id), Exit::kFinished);
  }
  EXPECT_LE(back[2], back[3]);
  EXPECT_EQ(d.sched().stats().num_recomputes, 0);
  d.expect_all_free();
}

TEST(Scheduler, SwapFallsBackToRecomputeWhenTheHostPoolIsFull) {
  Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 1, 4);
  fill_four(d);
  auto out = d.step();
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{3, 2}));
  EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapOut), 1);
  EXPECT_EQ(d.sched().find(3)->status, SeqStatus::kSwapped);
  EXPECT_EQ(d.sched().find(2)->status, SeqStatus::kWaiting);
  EXPECT_EQ(d.sched().find(2)->num_computed_tokens, 0);
  EXPECT_EQ(d.kv().host_pool().num_free(), 0);
  EXPECT_EQ(d.sched().stats().num_swap_outs, 1);
  EXPECT_EQ(d.sched().stats().num_recomputes, 1);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

TEST(Scheduler, SwapWithoutAHostPoolAlwaysRecomputes) {
  Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 0, 4);
  fill_four(d);
  auto out = d.step();
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{3, 2}));
  EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapOut), 0);
  EXPECT_EQ(d.sched().stats().num_recomputes, 2);
  ASSERT_TRUE(d.run_to_completion(200));
  d.expect_all_free();
}

// A swapped-out sequence has first claim on the blocks that come free: a new sequence that
// starts while it waits takes blocks it needs, and a stream of them could starve it.
TEST(Scheduler, SwappedSequenceComesBackBeforeLaterSequencesStart) {
  Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 8, 4);
  d.keep_history(true);
  ASSERT_TRUE(d.add(1, 4, 8, 0).ok());   // R
  ASSERT_TRUE(d.add(2, 8, 12, 0).ok());  // S
  d.step();                              // R: 1 block, S: 2 blocks
  auto out = d.step();                   // R takes the last block; S must preempt itself
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{2}));
  EXPECT_EQ(d.sched().find(2)->status, SeqStatus::kSwapped);
  EXPECT_EQ(d.kv().device_pool().num_free(), 2);
  ASSERT_TRUE(d.add(3, 4, 6, 5).ok());  // W: would fit in the 2 free blocks
  const size_t added = d.history().size();
  ASSERT_TRUE(d.run_to_completion(200));
  size_t s_back = 0, w_start = 0;
  for (size_t i = added; i < d.history().size(); ++i) {
    if (s_back == 0 && find_scheduled(d.history()[i], 2)) s_back = i;
    if (w_start == 0 && find_scheduled(d.history()[i], 3)) w_start = i;
  }
  ASSERT_GT(s_back, 0u);
  ASSERT_GT(w_start, 0u);
  EXPECT_LE(s_back, w_start);
  d.expect_all_free();
}

// A swapped-in sequence must also get blocks for the tokens it computes next; otherwise it
// holds device blocks without running and is the first victim again: swap traffic for nothing.
TEST(Scheduler, SwapsInOnlyWhenTheNextTokensFitToo) {
  Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 8, 4);
  ASSERT_TRUE(d.add(1, 4, 8, 0).ok());
  ASSERT_TRUE(d.add(2, 8, 12, 0).ok());
  d.step();
  auto out = d.step();  // S (2) swaps itself out: 2 blocks free, S needs 3 to continue
  ASSERT_EQ(out.preempted, (std::vector<SeqId>{2}));
  out = d.step();
  EXPECT_EQ(kv::count_block_ops(out.block_ops, kv::BlockOp::Kind::kSwapIn), 0);
  EXPECT_EQ(d.sched().find(2)->status, SeqStatus::kSwapped);
  ASSERT_TRUE(d.run_to_completion(200));
  EXPECT_EQ(d.sched().stats().num_swap_outs, 1);
  d.expect_all_free();
}

// ---------------------------------------------------------------------------------------------
// Removal

TEST(Scheduler, RemoveFreesEverythingInEveryState) {
  // Waiting, never scheduled.
  {
    Driver d(make_config(8, 8, 64, true), 8, 4, 4);
    ASSERT_TRUE(d.add(1, 20, 24).ok());
    d.abort(1);
    EXPECT_EQ(d.sched().find(1), nullptr);
    EXPECT_FALSE(d.sched().has_unfinished());
    d.sched().check_invariants();
    d.expect_all_free();
    d.abort(1);  // twice: no-op
  }
  // Mid-prefill.
  {
    Driver d(make_config(8, 8, 64, true), 8, 4, 4);
    ASSERT_TRUE(d.add(1, 20, 24).ok());
    d.step();
    ASSERT_TRUE(d.sched().find(1)->in_prefill());
    EXPECT_EQ(d.kv().device_pool().num_free(), 6);
    d.abort(1);
    d.sched().check_invariants();
    d.expect_all_free();
  }
  // Running decode, forked, and the fork's sibling.
  {
    Driver d(make_config(64, 8, 64, true), 8, 4, 4);
    ASSERT_TRUE(d.add(1, 6, 24, 0, std::nullopt, 0, {2}).ok());
    d.step();  // the prompt, and the fork
    ASSERT_NE(d.sched().find(2), nullptr);
    d.step();
    EXPECT_EQ(d.sched().find(1)->status, SeqStatus::kRunning);
    d.abort(1);
    d.sched().check_invariants();
    EXPECT_LT(d.kv().device_pool().num_free(), 8);
    d.abort(2);
    d.sched().remove(2);
    d.expect_all_free();
  }
  // Swapped, and waiting after a recompute preemption.
  {
    Driver d(make_config(64, 8, 64, true, PreemptionMode::kSwap), 4, 1, 4);
    fill_four(d, 12, 12);
    d.step();
    ASSERT_EQ(d.sched().find(3)->status, SeqStatus::kSwapped);
    ASSERT_EQ(d.sched().find(2)->status, SeqStatus::kWaiting);
    ASSERT_EQ(d.sched().find(2)->num_preemptions, 1);
    d.abort(3);
    d.sched().check_invariants();
    EXPECT_EQ(d.kv().host_pool().num_free(), 1);
    d.abort(2);
    d.sched().check_invariants();
    d.abort(1);
    d.abort(4);
    EXPECT_FALSE(d.sched().has_unfinished());
    d.expect_all_free();
  }
}

TEST(Scheduler, AbortsInEveryStateWhileOthersRunLeaveOthersIntact) {
  Driver d(make_config(8, 4, 64, true, PreemptionMode::kSwap), 6, 3, 4);
  for (SeqId id = 1; id <= 8; ++id)
    ASSERT_TRUE(d.add(id, 3 + id * 2, 8 + id * 2, static_cast<int32_t>(id % 3)).ok());
  for (int i = 0; i < 6; ++i) d.step();
  // Abort one sequence of each state present, then let the rest finish.
  std::set<SeqStatus> seen;
  for (SeqId id = 1; id <= 8; ++id) {
    const Sequence* s = d.sched().find(id);
    if (s != nullptr && seen.insert(s->status).second) d.abort(id);
  }
  EXPECT_GE(seen.size(), 2u);
  ASSERT_TRUE(d.run_to_completion(500));
  d.expect_all_free();
}

// ---------------------------------------------------------------------------------------------
// Forks

TEST(Scheduler, ForkSharesThePromptAndCopiesThePartialBlockOnWrite) {
  Driver d(make_config(64, 8, 64, true), 8, 0, 4);
  ASSERT_TRUE(d.add(1, 6, 12, 0, std::nullopt, 0, {2}).ok());
  const SchedulerOutput first = d.step();  // the prompt: the child forks and samples its own token
  ASSERT_EQ(first.forks.size(), 1u);
  EXPECT_EQ(first.forks[0].parent, 1);
  EXPECT_EQ(first.forks[0].child, 2);
  const auto shared = d.kv().block_table(1);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(d.kv().block_table(2), shared);
  EXPECT_EQ(d.sched().find(2)->num_computed_tokens, 6);
  EXPECT_EQ(d.sched().find(2)->status, SeqStatus::kRunning);
  EXPECT_NE(d.sched().find(1)->tokens.back(), d.sched().find(2)->tokens.back());

  auto out = d.step();
  ASSERT_EQ(out.scheduled.size(), 2u);
  ASSERT_EQ(out.block_ops.size(), 1u);  // only the first writer copies
  EXPECT_EQ(out.block_ops[0].kind, kv::BlockOp::Kind::kCopy);
  EXPECT_EQ(out.block_ops[0].src, shared[1]);
  EXPECT_EQ(d.kv().block_table(1)[0], shared[0]);  // the full prompt block stays shared
  EXPECT_EQ(d.kv().block_table(2)[0], shared[0]);
  EXPECT_EQ(d.kv().device_pool().ref_count(shared[0]), 2);
  EXPECT_EQ(d.kv().block_table(1)[1], out.block_ops[0].dst);
  EXPECT_EQ(d.kv().block_table(2)[1], shared[1]);
  // The driver's KV model checks both children read their own tokens from here on.
  ASSERT_TRUE(d.run_to_completion(100));
  EXPECT_EQ(d.exits().at(1), Exit::kFinished);
  EXPECT_EQ(d.exits().at(2), Exit::kFinished);
  d.expect_all_free();
}

// The engine runs a step's swap-outs before its copies. A sequence that copies a shared block
// on write and is then swapped out in the same step must take the copy's source to the host,
// not the fresh block the copy has not yet filled.
TEST(Scheduler, SwapOutRightAfterCopyOnWriteKeepsTheVictimsKv) {
  Driver d(make_config(7, 8, 64, true, PreemptionMode::kSwap), 5, 16, 4);
  d.keep_history(true);
  // P: a 10-token prompt (its last block partial), two chunks; C forks from it when it completes.
  ASSERT_TRUE(d.add(1, 10, 20, 1, std::nullopt, 0, {3}).ok());
  d.step();                               // P's first 7 tokens
  ASSERT_TRUE(d.add(2, 18, 20, 0).ok());  // H: high priority, long prompt
  d.step();                               // P's last 3 tokens (C forks); H's first 4
  ASSERT_NE(d.sched().find(3), nullptr);
  // P copies the shared partial block on write; H's chunk needs 2 blocks: C, then P, swapped.
  auto out = d.step();
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(out.preempted, (std::vector<SeqId>{3, 1}));
  EXPECT_EQ(d.sched().find(1)->status, SeqStatus::kSwapped);
  EXPECT_EQ(d.sched().find(3)->status, SeqStatus::kSwapped);
  ASSERT_TRUE(d.run_to_completion(100));  // the KV model checks P's tokens after its swap-in
  EXPECT_EQ(d.exits().at(1), Exit::kFinished);
  EXPECT_EQ(d.exits().at(3), Exit::kFinished);
  d.expect_all_free();
}

TEST(Scheduler, ForkedChildrenArePreemptedAndRecomputedIndependently) {
  for (auto mode : {PreemptionMode::kRecompute, PreemptionMode::kSwap}) {
    SCOPED_TRACE(mode == PreemptionMode::kSwap ? "swap" : "recompute");
    Driver d(make_config(16, 8, 64, true, mode), 8, 4, 4);
    ASSERT_TRUE(d.add(1, 5, 24, 1, std::nullopt, 0, {10, 11, 12}).ok());
    d.step();
    ASSERT_TRUE(d.add(2, 14, 24, 0).ok());
    ASSERT_TRUE(d.run_to_completion(500));
    EXPECT_GT(d.sched().stats().num_preemptions, 0);
    for (SeqId id : {1, 2, 10, 11, 12}) EXPECT_EQ(d.exits().at(id), Exit::kFinished) << id;
    d.expect_all_free();
  }
}

using SchedulerDeathTest = ::testing::Test;

TEST_F(SchedulerDeathTest, MisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  kv::KvCacheManager kv(8, 0, 4);
  Scheduler s(make_config(64, 8, 64, true), kv);
  Sequence seq;
  seq.id = 1;
  seq.tokens = {1, 2, 3};
  seq.max_total_tokens = 8;
  seq.forks = {{1, 2, 2}};
  ASSERT_TRUE(s.add(seq).ok());
  EXPECT_DEATH((void)s.add(seq), "duplicate sequence id 1");
  ModelRunnerOutput sampled;
  sampled.sequences.emplace_back();
  sampled.sequences[0].id = 1;
  sampled.sequences[0].token_ids = {7};
  EXPECT_DEATH(s.update({}, sampled), "sequence 1 sampled while not running");
  sampled.sequences[0].num_accepted = 1;
  seq.id = 2;
  seq.forks.clear();
  ASSERT_TRUE(s.add(seq).ok());  // waiting: it holds no blocks the KV manager would notice
  // Sequence 1's prompt completes: forking it into sequence 2, which exists, is a bug.
  EXPECT_DEATH(s.schedule(), "fork into existing sequence 2");
}

// ---------------------------------------------------------------------------------------------
// Speculative tokens

TEST(Scheduler, AVerificationCommitsTheKeptProposalsAndGivesBackTheRest) {
  kv::KvCacheManager kv(16, 0, 4, /*prefix caching*/ true);
  Scheduler s(make_config(64, 8, 64, true), kv);
  Sequence seq;
  seq.id = 1;
  seq.tokens = {1, 10, 11, 12, 13};
  seq.num_prompt_tokens = 5;
  seq.max_total_tokens = 32;
  ASSERT_TRUE(s.add(std::move(seq)).ok());
  const SchedulerOutput prompt = s.schedule();
  ASSERT_EQ(prompt.scheduled.size(), 1u);
  // The runner samples 20 (position 5) and proposes a tree: 30 and 31 under the root, 32 under 30,
  // 33 under 31.
  ModelRunnerOutput sampled;
  sampled.sequences.emplace_back();
  sampled.sequences[0].id = 1;
  sampled.sequences[0].token_ids = {20};
  sampled.sequences[0].proposals = {30, 31, 32, 33};
  sampled.sequences[0].proposal_parents = {-1, -1, 0, 1};
  s.update(prompt, sampled);
  const SchedulerOutput verify = s.schedule();
  ASSERT_EQ(verify.scheduled.size(), 1u);
  EXPECT_EQ(verify.scheduled[0].spec_token_ids, (std::vector<int32_t>{30, 31, 32, 33}));
  EXPECT_EQ(verify.scheduled[0].spec_tree_parents, (std::vector<int32_t>{-1, -1, 0, 1}));
  EXPECT_EQ(verify.scheduled[0].num_logits_rows, 5);
  EXPECT_EQ(kv.block_table(1).size(), 3u);  // positions 0..9
  // The runner kept 31 and 33 (it moved their K/V to positions 6 and 7 itself) and drew 40.
  ModelRunnerOutput verified;
  verified.sequences.emplace_back();
  verified.sequences[0].id = 1;
  verified.sequences[0].token_ids = {31, 33, 40};
  verified.sequences[0].num_proposals = 4;
  verified.sequences[0].num_accepted = 2;
  s.update(verify, verified);
  EXPECT_EQ(s.find(1)->tokens, (std::vector<int32_t>{1, 10, 11, 12, 13, 20, 31, 33, 40}));
  EXPECT_EQ(s.find(1)->num_computed_tokens, 8);
  EXPECT_TRUE(s.find(1)->spec_token_ids.empty());
  // Position 8 and on (the rejected proposals' slots) go back: two blocks cover 0..7.
  EXPECT_EQ(kv.block_table(1).size(), 2u);
  // The next plan tells the runner of the shorter table, and computes position 8.
  const SchedulerOutput next = s.schedule();
  ASSERT_EQ(next.cached_sequences.size(), 1u);
  EXPECT_EQ(next.cached_sequences[0].num_blocks, 3);
  ASSERT_EQ(next.scheduled.size(), 1u);
  EXPECT_EQ(next.scheduled[0].start, 8);
  s.check_invariants();
  s.remove(1);
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

TEST(Scheduler, AcceptingMoreThanWasProposedIsRefused) {
  kv::KvCacheManager kv(16, 0, 4, false);
  Scheduler s(make_config(64, 8, 64, true), kv);
  Sequence seq;
  seq.id = 1;
  seq.tokens = {1, 10};
  seq.num_prompt_tokens = 2;
  seq.max_total_tokens = 32;
  ASSERT_TRUE(s.add(std::move(seq)).ok());
  const SchedulerOutput prompt = s.schedule();
  ModelRunnerOutput sampled;
  sampled.sequences.emplace_back();
  sampled.sequences[0].id = 1;
  sampled.sequences[0].token_ids = {20};
  sampled.sequences[0].proposals = {30, 31};
  s.update(prompt, sampled);
  const SchedulerOutput verify = s.schedule();
  ModelRunnerOutput verified;
  verified.sequences.emplace_back();
  verified.sequences[0].id = 1;
  verified.sequences[0].token_ids = {30, 31, 32, 40};
  verified.sequences[0].num_accepted = 3;
  EXPECT_DEATH(s.update(verify, verified), "3 of 2 proposals accepted");
}

}  // namespace
}  // namespace vesper::sched

namespace vesper::sched {
namespace {

// --max-loras: at most that many distinct adapters among running sequences; a sequence whose
// adapter does not fit waits, and adapter sequences after it wait too (first come, first served
// among adapters), while sequences without an adapter go ahead. Each step's runner plan carries
// the sequence's adapter id.
TEST(Scheduler, MaxLorasBoundsDistinctAdaptersAndServesAdaptersInArrivalOrder) {
  SchedulerConfig config = make_config(64, 8, 64, true);
  config.max_loras = 2;
  Driver d(config, 64, 0, 4);
  const std::map<SeqId, uint64_t> adapter = {{1, 11}, {2, 12}, {3, 13}, {4, 0}, {5, 11}};
  for (const auto& [id, a] : adapter) ASSERT_TRUE(d.add(id, 6, 14, 0, std::nullopt, a).ok());
  std::map<SeqId, int64_t> first_step;
  while (d.sched().has_unfinished()) {
    const SchedulerOutput out = d.step();
    for (const NewSequenceData& n : out.new_sequences)
      EXPECT_EQ(n.adapter, adapter.at(n.id) == 0 ? -1 : static_cast<int32_t>(adapter.at(n.id)));
    for (const ScheduledSequence& s : out.scheduled) first_step.try_emplace(s.id, d.steps());
    std::set<uint64_t> running;
    d.sched().for_each_running([&](const Sequence& seq) {
      if (seq.adapter_id != 0) running.insert(seq.adapter_id);
    });
    EXPECT_LE(running.size(), 2u);
    ASSERT_LT(d.steps(), 200);
  }
  // 1, 2 and the plain 4 start at once; 3 (a third adapter) waits, and 5 (adapter 11, running)
  // waits behind it rather than overtake.
  EXPECT_EQ(first_step[1], first_step[2]);
  EXPECT_EQ(first_step[4], first_step[1]);
  EXPECT_GT(first_step[3], first_step[1]);
  EXPECT_GE(first_step[5], first_step[3]);
  // The last sequences' copies are released once a plan no longer reads them: the next one.
  d.sched().schedule();
  EXPECT_EQ(d.binder().pinned(), 0) << "every pin was released";
}

}  // namespace
}  // namespace vesper::sched

namespace vesper::sched {
namespace {

// An adapter whose copy is being read (off the engine thread) is not ready: its sequence waits,
// and so do later adapter sequences (first come, first served among adapters), while plain
// sequences run; once the read is done the sequence starts, with its adapter pinned.
TEST(Scheduler, SequenceWaitsWhileItsAdapterIsReadAndPlainOnesGoAhead) {
  SchedulerConfig config = make_config(64, 8, 64, true);
  config.max_loras = 2;
  Driver d(config, 64, 0, 4);
  d.binder().delay(11, 3);  // three schedule() calls find adapter 11 still being read
  const std::map<SeqId, uint64_t> adapter = {{1, 11}, {2, 0}, {3, 12}};
  for (const auto& [id, a] : adapter) ASSERT_TRUE(d.add(id, 6, 10, 0, std::nullopt, a).ok());
  std::map<SeqId, int64_t> first_step;
  bool waited = false;
  while (d.sched().has_unfinished()) {
    const SchedulerOutput out = d.step();
    waited = waited || d.sched().waited_on_adapter();
    for (const ScheduledSequence& s : out.scheduled) first_step.try_emplace(s.id, d.steps());
    ASSERT_LT(d.steps(), 200);
  }
  EXPECT_TRUE(waited);
  EXPECT_EQ(first_step[2], 1) << "the plain sequence does not wait for the read";
  EXPECT_EQ(first_step[1], 4) << "the adapter sequence starts once the read is done";
  EXPECT_GE(first_step[3], first_step[1]) << "a later adapter sequence does not overtake it";
  d.sched().schedule();
  EXPECT_EQ(d.binder().pinned(), 0);
}

}  // namespace
}  // namespace vesper::sched
