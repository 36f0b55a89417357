// Adapters in the engine (stories260K with the zed / bim LoRA and the VeRA zed adapter): a
// request's tokens and logprobs are the same bits however requests of different adapters were
// batched, chunked, preempted or served from the prefix cache; the prefix cache shares blocks
// within an adapter and never across adapters; forks (n > 1) keep their adapter; no adapter
// stays held once requests finish or are aborted.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::greedy_params;
using testing_util::make_engine;
using testing_util::run_to_completion;

EngineConfig lora_config() {
  EngineConfig c = testing_util::stories_config();
  c.model_path = "../shared/models/stories260K.gguf";
  c.scheduler.max_model_len = 128;
  c.lora.enable_lora = true;
  c.lora.max_loras = 3;
  c.lora.max_lora_rank = 32;
  c.lora.modules = {{"zed", "../shared/models/lora/zed/adapter.gguf", ""},
                    {"bim", "../shared/models/lora/bim", ""},
                    {"vzed", "../shared/models/vera/zed", ""}};
  return c;
}

const char* const kAdapters[] = {"zed", "bim", "vzed", ""};

// Every prompt under every adapter (and the base), request id "adapter|i"; all at once.
testing_util::RunResult run_under_each_adapter(const EngineConfig& config,
                                               const std::vector<std::string>& prompts) {
  auto e = make_engine(config);
  testing_util::RunResult r;
  if (!e) return r;
  for (const char* a : kAdapters)
    for (size_t i = 0; i < prompts.size(); ++i) {
      EngineRequest req{std::string(a) + "|" + std::to_string(i),
                        e->tokenizer().encode(prompts[i], true, false), greedy_params(24)};
      req.lora_name = a;
      EXPECT_TRUE(e->add_request(std::move(req)).ok());
    }
  r.outputs = run_to_completion(*e);
  r.stats = e->stats();
  testing_util::expect_no_leaks(*e);
  EXPECT_TRUE(r.stats.running_adapters.empty());
  return r;
}

TEST(LoraEngine, OutputsDoNotDependOnSchedulingOrOtherAdapters) {
  const std::vector<std::string> prompts = {"Once upon a time", "One day, a little girl named",
                                            "Once upon a time, there was a boy named",
                                            "Tom and his dog went to the beach. The sun was"};
  // Reference: one request at a time.
  EngineConfig one = lora_config();
  one.scheduler.max_num_seqs = 1;
  const auto alone = run_under_each_adapter(one, prompts);
  // The name the adapters teach shows up where the base says Lily.
  auto text_of = [&](const std::string& id) { return alone.outputs.at(id).outputs[0].text; };
  EXPECT_NE(text_of("zed|1").find("Zed"), std::string::npos) << text_of("zed|1");
  EXPECT_NE(text_of("bim|1").find("Bim"), std::string::npos) << text_of("bim|1");
  EXPECT_NE(text_of("vzed|1").find("Zed"), std::string::npos) << text_of("vzed|1");
  EXPECT_NE(text_of("|1").find("Lily"), std::string::npos) << text_of("|1");

  EngineConfig batched = lora_config();
  testing_util::expect_same(alone, run_under_each_adapter(batched, prompts), "all batched");
  EngineConfig chunked = lora_config();
  chunked.scheduler.max_num_batched_tokens = 7;
  testing_util::expect_same(alone, run_under_each_adapter(chunked, prompts), "chunks of 7 tokens");
  EngineConfig tight = lora_config();
  tight.cache.num_gpu_blocks_override = 12;
  tight.cache.block_size = 8;
  const auto preempted = run_under_each_adapter(tight, prompts);
  EXPECT_GT(preempted.stats.num_preemptions, 0);
  testing_util::expect_same(alone, preempted, "preempted");
  EngineConfig one_lora = lora_config();
  one_lora.lora.max_loras = 1;
  testing_util::expect_same(alone, run_under_each_adapter(one_lora, prompts), "--max-loras 1");
}

TEST(LoraEngine, PrefixCacheSharesWithinAnAdapterOnly) {
  auto e = make_engine(lora_config());
  ASSERT_NE(e, nullptr);
  const auto prompt = e->tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.",
      true, false);
  auto run = [&](const std::string& id, const std::string& adapter) {
    EngineRequest req{id, prompt, greedy_params(4)};
    req.lora_name = adapter;
    EXPECT_TRUE(e->add_request(std::move(req)).ok());
    return run_to_completion(*e).at(id);
  };
  const auto zed = run("a", "zed");
  EXPECT_EQ(zed.num_cached_tokens, 0);
  EXPECT_EQ(run("b", "bim").num_cached_tokens, 0);  // another adapter: no hit
  EXPECT_EQ(run("c", "").num_cached_tokens, 0);     // nor the base model
  const auto again = run("d", "zed");               // the same adapter: hit
  EXPECT_GT(again.num_cached_tokens, 0);
  EXPECT_EQ(again.outputs[0].token_ids, zed.outputs[0].token_ids);
  // The same name loaded again is another adapter id: its own chain.
  ASSERT_TRUE(e->adapters()->remove("zed"));
  ASSERT_TRUE(e->adapters()->add("zed", "../shared/models/lora/zed/adapter.gguf").ok());
  EXPECT_EQ(run("e", "zed").num_cached_tokens, 0);
}

TEST(LoraEngine, ForksKeepTheirAdapterAndAbortsReleaseIt) {
  auto e = make_engine(lora_config());
  ASSERT_NE(e, nullptr);
  sample::SamplingParams p = greedy_params(12);
  p.n = 3;
  EngineRequest req{"n3", e->tokenizer().encode("One day, a little girl named", true, false), p};
  req.lora_name = "bim";
  ASSERT_TRUE(e->add_request(std::move(req)).ok());
  const auto out = run_to_completion(*e).at("n3");
  ASSERT_EQ(out.outputs.size(), 3u);
  for (const auto& o : out.outputs) EXPECT_NE(o.text.find("Bim"), std::string::npos) << o.text;

  EngineRequest held{"held", e->tokenizer().encode("Once upon a time", true, false),
                     greedy_params(50)};
  held.lora_name = "vzed";
  ASSERT_TRUE(e->add_request(std::move(held)).ok());
  e->step();
  EXPECT_EQ(e->stats().running_adapters, std::vector<std::string>{"vzed"});
  EXPECT_TRUE(e->abort("held"));
  EXPECT_TRUE(e->stats().running_adapters.empty());
  // No request holds vzed now; the runner reads it until the next plan drops the sequence.
  EXPECT_TRUE(e->adapters()->remove("vzed"));
  EXPECT_EQ(e->adapters()->num_loaded(), 3);
  e->step();
  EXPECT_EQ(e->adapters()->num_loaded(), 2);
  EXPECT_EQ(e->adapters()->num_pinned(), 0);

  EngineRequest unknown{"u", {1, 2, 3}, greedy_params(2)};
  unknown.lora_name = "nope";
  auto st = e->add_request(std::move(unknown));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("no adapter named 'nope'"), std::string::npos);
}

TEST(LoraEngine, AnAdapterNameWithoutEnableLoraIsAnError) {
  EngineConfig c = testing_util::stories_config();
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);
  EngineRequest req{"x", {1, 2, 3}, greedy_params(2)};
  req.lora_name = "zed";
  auto st = e->add_request(std::move(req));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("--enable-lora"), std::string::npos);
}

}  // namespace
}  // namespace vesper::engine

namespace vesper::engine {
namespace {

// Waiting requests hold their adapter's name, not a loaded copy: with --max-cpu-loras 1 and
// --max-loras 1, requests for three adapters at once keep at most one copy loaded, read each
// adapter when its requests start running, and each gets its adapter's output.
TEST(LoraEngine, OnlyRunningSequencesPinCopies) {
  EngineConfig c = lora_config();
  c.lora.max_loras = 1;
  c.lora.max_cpu_loras = 1;
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->adapters()->num_loaded(), 1);
  const int64_t loads_at_start = e->adapters()->num_loads();
  for (const char* a : {"zed", "bim", "vzed"})
    for (int i = 0; i < 2; ++i) {
      EngineRequest req{std::string(a) + std::to_string(i),
                        e->tokenizer().encode("One day, a little girl named", true, false),
                        greedy_params(6)};
      req.lora_name = a;
      ASSERT_TRUE(e->add_request(std::move(req)).ok());
    }
  EXPECT_EQ(e->adapters()->num_loads(), loads_at_start);  // nothing read for waiting requests
  std::map<std::string, RequestOutput> done;
  while (e->has_unfinished()) {
    for (auto& out : e->step())
      if (out.finished) done[out.request_id] = std::move(out);
    EXPECT_LE(e->adapters()->num_loaded(), 1);
    EXPECT_LE(e->adapters()->num_pinned(), 1);
    e->check_invariants();
  }
  ASSERT_EQ(done.size(), 6u);
  for (const auto& [id, out] : done)
    EXPECT_EQ(out.outputs[0].text.rfind(id[0] == 'b' ? " Bim" : " Zed", 0), 0u)
        << id << ": " << out.outputs[0].text;
  EXPECT_GE(e->adapters()->num_loads(), loads_at_start + 2);
}

}  // namespace
}  // namespace vesper::engine

namespace vesper::engine {
namespace {

// An adapter whose file disappears after it was checked: its requests end (finish_reason
// "abort", nothing sampled) when they would start running; other requests are unharmed.
TEST(LoraEngine, AnAdapterThatNoLongerLoadsAbortsOnlyItsRequests) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "vesper_engine_vanishing_bim";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator("../shared/models/lora/bim"))
    fs::copy(f.path(), dir + "/" + f.path().filename().string());
  EngineConfig c = lora_config();
  c.lora.max_loras = 1;
  c.lora.max_cpu_loras = 1;
  c.lora.modules = {{"bim", dir, ""}, {"zed", "../shared/models/lora/zed/adapter.gguf", ""}};
  auto e = make_engine(c);
  ASSERT_NE(e, nullptr);  // bim was read, checked, and dropped for zed
  fs::remove_all(dir);
  const auto prompt = e->tokenizer().encode("One day, a little girl named", true, false);
  for (const char* a : {"bim", "zed", ""}) {
    EngineRequest req{std::string("r-") + a, prompt, greedy_params(6)};
    req.lora_name = a;
    ASSERT_TRUE(e->add_request(std::move(req)).ok());
  }
  const auto done = run_to_completion(*e);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done.at("r-bim").outputs[0].finish_reason, "abort");
  EXPECT_TRUE(done.at("r-bim").outputs[0].token_ids.empty());
  EXPECT_EQ(done.at("r-zed").outputs[0].text.rfind(" Zed", 0), 0u);
  EXPECT_EQ(done.at("r-").outputs[0].text.rfind(" Lily", 0), 0u);
  testing_util::expect_no_leaks(*e);
  // Nothing holds bim's registration any more: unlisted, it is forgotten.
  auto bim = e->adapters()->hold("bim");
  ASSERT_TRUE(bim.ok());
  e->adapters()->unhold(*bim);
  EXPECT_TRUE(e->adapters()->remove("bim"));
  EXPECT_EQ(e->adapters()->name_of(*bim), "") << "the failed request still holds its adapter";
}

}  // namespace
}  // namespace vesper::engine
