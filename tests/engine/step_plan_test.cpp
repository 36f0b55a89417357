// The step plan travels: every plan a scheduler makes is serialized to bytes, and a second
// ModelRunner (its own backend, model and KV storage, and no scheduler: it sees nothing but the
// bytes) runs each step from the deserialized copy. Its logits must equal, bit for bit, those of
// the runner that got the plan itself, and it must sample the same tokens (the plan brings each
// sequence's parameters, seed and grammar), through prefill chunks, decodes, forks (n > 1,
// copy-on-write), preemption by swap (swap-outs and swap-ins) and prefix-cache hits. Corrupt
// bytes are errors.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu_backend.h"
#include "engine/engine_test_util.h"
#include "engine/grammar_vocabulary.h"
#include "engine/model_runner.h"
#include "grammar/gbnf.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace vesper::engine {
namespace {

struct Side {
  std::unique_ptr<backend::CpuBackend> backend;
  std::unique_ptr<model::Model> model;
  std::unique_ptr<ModelRunner> runner;
};

Side make_side(int64_t blocks, int64_t swap_blocks, int64_t block_size,
               const std::vector<int32_t>& eog_ids) {
  Side s;
  s.backend = std::make_unique<backend::CpuBackend>(2);
  auto m = model::Model::load(testing_util::kStoriesLong, *s.backend);
  EXPECT_TRUE(m.ok()) << m.error().message;
  s.model = std::move(*m);
  RunnerConfig rc;
  rc.max_model_len = 128;
  rc.eog_ids = eog_ids;
  s.runner = std::make_unique<ModelRunner>(*s.model, s.model->kv_spec(block_size), blocks,
                                           swap_blocks, rc);
  return s;
}

TEST(StepPlan, ARunnerWithNoSchedulerReplaysSerializedPlansBitForBit) {
  constexpr int64_t kBlockSize = 8, kBlocks = 24, kSwapBlocks = 64;  // 192 tokens: preempts often
  backend::CpuBackend probe(1);
  auto probe_model = model::Model::load(testing_util::kStoriesLong, probe);
  ASSERT_TRUE(probe_model.ok());
  auto tok = tokenizer::Tokenizer::from_gguf((*probe_model)->file());
  ASSERT_TRUE(tok.ok());
  Side local = make_side(kBlocks, kSwapBlocks, kBlockSize, tok->eog_ids());
  Side remote = make_side(kBlocks, kSwapBlocks, kBlockSize, tok->eog_ids());
  // Structured output travels as its grammar; the remote side compiles it against its vocabulary.
  const auto vocab = grammar_vocabulary(*tok);
  auto words = grammar::parse_gbnf("root ::= [ a-zA-Z.,]*");
  ASSERT_TRUE(words.ok());
  const auto constrained = std::make_shared<const grammar::CompiledGrammar>(*words, vocab);
  const sample::GrammarCompiler compile = [&](grammar::Grammar g) {
    return std::make_shared<const grammar::CompiledGrammar>(std::move(g), vocab);
  };

  kv::KvCacheManager kv(kBlocks, kSwapBlocks, kBlockSize, /*enable_prefix_caching=*/true);
  sched::SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 40;
  cfg.max_num_seqs = 6;
  cfg.max_model_len = 128;
  cfg.preemption_mode = sched::PreemptionMode::kSwap;
  sched::Scheduler sched(cfg, kv);

  const auto prompts = testing_util::varied_prompts(10);
  sched::SeqId next_id = 1;
  int64_t forks = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sched::Sequence seq;
    seq.id = next_id;
    // Every other prompt twice, so that prefix-cache hits happen.
    seq.tokens = tok->encode(prompts[i / 2 * 2], true, false);
    seq.num_prompt_tokens = seq.num_tokens();
    seq.max_total_tokens = seq.num_tokens() + 20;
    seq.arrival = static_cast<int64_t>(i);
    // Sampled at temperature, seeded; some with logprobs, some constrained by a grammar.
    auto params = std::make_shared<sample::SamplingParams>();
    params->temperature = 0.8f;
    params->max_tokens = 20;
    params->ignore_eos = true;
    if (i % 3 == 1) params->logprobs = 2;
    if (i % 4 == 2) params->grammar = constrained;
    // Every third prompt samples twice (n = 2): copy-on-write later.
    if (i % 3 == 0) {
      params->n = 2;
      seq.forks.push_back({seq.id, seq.id + 1, 1000 + i});
      ++forks;
    }
    seq.sampling = {params, 20261205 + i};
    next_id += params->n;
    ASSERT_TRUE(sched.add(seq).ok());
  }

  int64_t steps = 0, swaps = 0, copies = 0, compared_rows = 0, sampled = 0;
  sched::ModelRunnerOutput local_out, remote_out;
  while (sched.has_unfinished()) {
    ASSERT_LT(++steps, 2000);
    const sched::SchedulerOutput plan = sched.schedule();
    const std::vector<uint8_t> bytes = plan.serialize();
    ASSERT_TRUE(local.runner->execute(plan, local_out).ok());
    // The other side knows nothing but the bytes.
    auto copy = sched::SchedulerOutput::deserialize(bytes, compile);
    ASSERT_TRUE(copy.ok()) << copy.error().message;
    const Status ran = remote.runner->execute(*copy, remote_out);
    ASSERT_TRUE(ran.ok()) << ran.error().message;
    swaps += kv::count_block_ops(plan.block_ops, kv::BlockOp::Kind::kSwapOut) +
             kv::count_block_ops(plan.block_ops, kv::BlockOp::Kind::kSwapIn);
    copies += kv::count_block_ops(plan.block_ops, kv::BlockOp::Kind::kCopy);

    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const sched::ScheduledSequence& s = plan.scheduled[i];
      if (!s.samples()) continue;
      const int32_t row = local.runner->first_logits_row()[i];
      ASSERT_EQ(remote.runner->first_logits_row()[i], row);
      const auto a = local.runner->logits_row(row), b = remote.runner->logits_row(row);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "step " << steps << " seq " << s.id;
      ++compared_rows;
    }
    ASSERT_EQ(local_out.sequences.size(), remote_out.sequences.size()) << "step " << steps;
    for (size_t j = 0; j < local_out.sequences.size(); ++j) {
      const sched::SampledSequence &x = local_out.sequences[j], &y = remote_out.sequences[j];
      ASSERT_EQ(x.id, y.id);
      ASSERT_EQ(x.token_ids, y.token_ids) << "step " << steps << " seq " << x.id;
      ASSERT_EQ(x.finished, y.finished);
      ASSERT_EQ(x.logprobs.size(), y.logprobs.size());
      for (size_t t = 0; t < x.logprobs.size(); ++t)
        ASSERT_EQ(x.logprobs[t].logprob, y.logprobs[t].logprob);
      ++sampled;
    }
    sched.update(plan, local_out);
    sched.check_invariants();
  }
  EXPECT_GT(compared_rows, 200);
  EXPECT_GT(sampled, 200);
  EXPECT_GT(forks, 0);
  EXPECT_GT(swaps, 0) << "the workload was meant to preempt by swap";
  EXPECT_GT(copies, 0) << "the workload was meant to copy on write";
  EXPECT_GT(sched.stats().prefix_cache_hits, 0);
  EXPECT_EQ(kv.device_pool().num_used(), 0);
}

// A plan from elsewhere may name what the runner does not have: blocks past its storage, tokens
// past its vocabulary (in the prompt or the sampling parameters), positions its tables do not
// cover, forks of a sequence that does not sample. Each is an error naming it; nothing runs.
TEST(StepPlan, ARunnerRefusesWhatItsStorageAndVocabularyDoNotHold) {
  Side side = make_side(4, 4, 8, {});
  auto params = std::make_shared<const sample::SamplingParams>();
  auto expect_refused = [&](const sched::SchedulerOutput& plan, const std::string& what) {
    sched::ModelRunnerOutput out;
    const Status st = side.runner->execute(plan, out);
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
    EXPECT_TRUE(out.sequences.empty());
  };
  auto one = [&](sched::SeqId id, std::vector<int32_t> tokens, std::vector<int32_t> table) {
    sched::SchedulerOutput plan;
    const auto n = static_cast<int64_t>(tokens.size());
    plan.new_sequences.push_back({id, std::move(tokens), n, std::move(table), -1, 0, {params, 1}});
    plan.scheduled.push_back({id, 0, n, 0, 1, {}, {}});
    return plan;
  };
  expect_refused(one(1, {1, 2, 3}, {99}), "block 99");
  expect_refused(one(2, {1, 2, 999999}, {0}), "outside the vocabulary");
  expect_refused(one(3, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1}), "does not hold");
  auto biased = std::make_shared<sample::SamplingParams>();
  biased->logit_bias = {{70000, 1.0f}};
  sched::SchedulerOutput bias = one(4, {1, 2}, {2});
  bias.new_sequences[0].sampling.params = biased;
  expect_refused(bias, "logit_bias: token id 70000");
  sched::SchedulerOutput fork = one(5, {1, 2}, {3});
  fork.scheduled[0].num_logits_rows = 0;  // a chunk that does not sample
  fork.forks.push_back({5, 6, 2});
  expect_refused(fork, "forks sequence 5");
  // What deserialization can tell alone: a negative block, a logits count that is no plan's.
  sched::SchedulerOutput negative = one(7, {1, 2}, {-3});
  EXPECT_FALSE(sched::SchedulerOutput::deserialize(negative.serialize()).ok());
  sched::SchedulerOutput rows = one(8, {1, 2}, {0});
  rows.scheduled[0].num_logits_rows = 2;
  EXPECT_FALSE(sched::SchedulerOutput::deserialize(rows.serialize()).ok());
}

TEST(StepPlan, CorruptOrTruncatedBytesAreErrorsNotCrashes) {
  sched::SchedulerOutput plan;
  auto params = std::make_shared<sample::SamplingParams>();
  params->temperature = 0.7f;
  params->stop = {"The end"};
  params->logit_bias = {{5, -1.5f}};
  params->seed = 9;
  plan.new_sequences.push_back({7, {1, 2, 3, 4, 5}, 4, {3, 9}, 2, 0, {params, 77}});
  plan.cached_sequences.push_back({8, false, 12, 3, {{1, 11}}, {12}, 0, -1});
  plan.forks.push_back({7, 21, 78});
  plan.block_ops.push_back(kv::BlockOp::swap_out({4, 5}));
  plan.block_ops.push_back(kv::BlockOp::copy({1, 2}));
  plan.block_ops.push_back(kv::BlockOp::quantize({{6, 7}, 8}));
  plan.block_ops.push_back(kv::BlockOp::swap_in({9, 3}));
  plan.scheduled.push_back({7, 0, 5, 0, 1, {}, {}});
  plan.scheduled.push_back({8, 9, 3, 2, 3, {100, 101}, {-1, -1}});
  plan.finished = {3};
  plan.preempted = {4};
  plan.recomputed = {4};
  plan.num_batched_tokens = 8;
  plan.num_running_or_waiting = 5;
  const std::vector<uint8_t> bytes = plan.serialize();
  auto same = sched::SchedulerOutput::deserialize(bytes);
  ASSERT_TRUE(same.ok()) << same.error().message;
  EXPECT_TRUE(*same == plan);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto cut = sched::SchedulerOutput::deserialize(std::span<const uint8_t>(bytes.data(), n));
    EXPECT_FALSE(cut.ok()) << "a plan cut at byte " << n << " was accepted";
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bad = bytes;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    (void)sched::SchedulerOutput::deserialize(
        bad);  // an error or another valid plan, never a crash
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(sched::SchedulerOutput::deserialize(longer).ok());
}

}  // namespace
}  // namespace vesper::engine
