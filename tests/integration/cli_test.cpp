// End-to-end tests of the `vesper` command line on real models: generate (text and --json,
// greedy against llama.cpp's ids, seeded sampling), inspect, quantize, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "gguf/gguf.h"

namespace vesper {
namespace {

using testing_util::kStories;
using testing_util::kStoriesF32;

using testing_util::json_lines;
using testing_util::run_vesper;

nlohmann::json expected_stories() {
  std::ifstream f("bench/llamacpp/expected_stories260K.json");
  return nlohmann::json::parse(f);
}

TEST(CliGenerate, GreedyTextEqualsLlamaCpp) {
  const auto expected = expected_stories()["results"][0];
  auto r = run_vesper({"generate", kStories, "--prompt", expected["prompt"], "--max-tokens", "32",
                       "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string text = r.out;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  EXPECT_EQ(text, expected["text"].get<std::string>());
}

TEST(CliGenerate, JsonGivesIdsTextAndFinishReasonPerPromptInOrder) {
  const auto results = expected_stories()["results"];
  std::vector<std::string> args = {"generate",      kStories, "--max-tokens", "32",
                                   "--temperature", "0",      "--json"};
  for (int i = 0; i < 3; ++i) {
    args.push_back("--prompt");
    args.push_back(results[i]["prompt"]);
  }
  auto r = run_vesper(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["prompt"], results[i]["prompt"]);
    EXPECT_EQ(lines[i]["token_ids"], results[i]["ids"]);
    EXPECT_EQ(lines[i]["prompt_token_ids"], results[i]["prompt_ids"]);
    EXPECT_EQ(lines[i]["text"], results[i]["text"]);
    EXPECT_EQ(lines[i]["finish_reason"], "length");
  }
}

// stories260K (trained with llama2.c) ends its stories with BOS, never with its EOS token, so a
// copy whose eos_token_id is 1 ends generation naturally: the EOS path, through the CLI.
TEST(CliGenerate, StopsAtEndOfSequenceWithFinishReasonStop) {
  auto file = gguf::GgufFile::open(kStoriesF32);
  ASSERT_TRUE(file.ok());
  gguf::GgufWriter w;
  w.copy_metadata(*file);
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(1));
  for (const auto& t : file->tensors())
    ASSERT_TRUE(w.add_tensor(t.name, t.shape, t.type, {t.data, t.size_bytes}).ok());
  const std::string path = ::testing::TempDir() + "vesper_stories_eos1.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto r = run_vesper({"generate", path, "--prompt", "Once upon a time", "--max-tokens", "1000",
                       "--temperature", "1", "--seed", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["finish_reason"], "stop");
  const auto ids = lines[0]["token_ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 1);
  EXPECT_LT(ids.size(), 1000u);
  // With --ignore-eos the same run goes on to the length limit.
  auto more = run_vesper({"generate", path, "--prompt", "Once upon a time", "--max-tokens", "400",
                          "--temperature", "1", "--seed", "1", "--json", "--ignore-eos"});
  auto more_lines = json_lines(more.out);
  ASSERT_EQ(more_lines.size(), 1u);
  EXPECT_EQ(more_lines[0]["finish_reason"], "length");
  EXPECT_EQ(more_lines[0]["token_ids"].size(), 400u);
  std::remove(path.c_str());
}

TEST(CliGenerate, StopStringsEndTheTextBeforeTheMatch) {
  auto r = run_vesper({"generate", kStories, "--prompt", "Once upon a time", "--max-tokens", "32",
                       "--temperature", "0", "--stop", "Lily", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto line = json_lines(r.out).at(0);
  EXPECT_EQ(line["text"], ", there was a little girl named ");
  EXPECT_EQ(line["finish_reason"], "stop");
}

TEST(CliGenerate, SeededSamplingIsReproducible) {
  std::vector<std::string> args = {"generate",     kStories, "--prompt",      "The little dog",
                                   "--max-tokens", "40",     "--temperature", "0.9",
                                   "--top-p",      "0.95",   "--top-k",       "40",
                                   "--seed",       "42",     "--json"};
  auto a = run_vesper(args, "a"), b = run_vesper(args, "b");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(json_lines(a.out)[0]["token_ids"], json_lines(b.out)[0]["token_ids"]);
  args[args.size() - 2] = "43";
  auto c = run_vesper(args, "c");
  EXPECT_NE(json_lines(a.out)[0]["token_ids"], json_lines(c.out)[0]["token_ids"]);
}

TEST(CliGenerate, BadFlagsGetClearErrors) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"generate", kStories, "--prompt", "x", "--max-tokens", "-1"}, 2, "--max-tokens"},
      {{"generate", kStories, "--prompt", "x", "--max-tokens", "abc"}, 2, "--max-tokens"},
      {{"generate", kStories, "--prompt", "x", "--temperature", "-0.5"}, 1, "temperature"},
      {{"generate", kStories, "--prompt", "x", "--top-p", "1.5"}, 1, "top_p"},
      {{"generate", kStories, "--prompt", "x", "--threads", "0"}, 2, "--threads"},
      {{"generate", kStories, "--prompt", "x", "--no-such-flag"}, 2, "--no-such-flag"},
      {{"generate", kStories}, 1, "--prompt"},
      {{"generate", "missing.gguf", "--prompt", "x"}, 1, "missing.gguf"},
      {{"generate", "README.md", "--prompt", "x"}, 1, "README.md: not a GGUF file"},
      {{"generate", kStories, "--prompt", "x", "--max-tokens", "500"}, 1, "--max-model-len 128"},
      {{"frobnicate"}, 2, "unknown command \"frobnicate\""},
  };
  for (const auto& c : cases) {
    auto r = run_vesper(c.args);
    std::string all;
    for (const auto& a : c.args) all += a + " ";
    EXPECT_EQ(r.exit_code, c.code) << all << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << all << "\nstderr: " << r.err;
  }
}

TEST(CliGenerate, PromptsFileRunsAsOneBatchInInputOrder) {
  const std::string path = ::testing::TempDir() + "vesper_prompts.jsonl";
  {
    std::ofstream f(path);
    f << "Once upon a time\n";
    f << R"({"prompt": "The little dog", "max_tokens": 5})"
      << "\n";
    f << R"({"prompt": "Once upon a time", "n": 2, "stop": ["Lily"]})"
      << "\n";
    // The first prompt again, as the token ids it encodes to (vLLM's TokensPrompt).
    f << nlohmann::json{{"prompt_token_ids", expected_stories()["results"][0]["prompt_ids"]}}.dump()
      << "\n";
  }
  auto r = run_vesper({"generate", kStories, "--prompts-file", path, "--max-tokens", "32",
                       "--temperature", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[3]["prompt_token_ids"], expected_stories()["results"][0]["prompt_ids"]);
  EXPECT_EQ(lines[3]["token_ids"], expected_stories()["results"][0]["ids"]);
  EXPECT_EQ(lines[0]["token_ids"], expected_stories()["results"][0]["ids"]);
  EXPECT_EQ(lines[1]["prompt"], "The little dog");
  EXPECT_EQ(lines[1]["token_ids"].size(), 5u);
  ASSERT_EQ(lines[2]["outputs"].size(), 2u);
  EXPECT_EQ(lines[2]["outputs"][1]["text"], ", there was a little girl named ");
  EXPECT_EQ(lines[2]["finish_reason"], "stop");
  {
    std::ofstream f(path);
    f << R"({"prompt": "x", "temperature": "hot"})"
      << "\n";
  }
  auto bad = run_vesper({"generate", kStories, "--prompts-file", path});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find(path + ":1:"), std::string::npos) << bad.err;
  for (const auto& [line, error] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "prompt_token_ids": [1, 2]})",
            ":1: one of \"prompt\" (a string) and \"prompt_token_ids\" (token ids) is required"},
           {R"({"prompt_token_ids": []})", ":1: field \"prompt_token_ids\" is empty"},
           {R"({"prompt_token_ids": [1, "two"]})", ":1: a field has the wrong type"},
           {R"({"prompt_token_ids": [1, 99999]})",
            "prompt 1: prompt token id 99999 is outside the vocabulary (0..511)"}}) {
    std::ofstream(path) << line << "\n";
    auto r = run_vesper({"generate", kStories, "--prompts-file", path});
    EXPECT_EQ(r.exit_code, 1) << line;
    EXPECT_NE(r.err.find(error), std::string::npos) << line << ": " << r.err;
  }
  std::remove(path.c_str());
}

// The engine loop's flags: the same greedy ids and texts with output processing on the engine
// thread, planned ahead, and in multi-step plans; the startup log says which; bad values and
// async scheduling with speculation are refused naming the flag.
TEST(CliGenerate, EngineLoopFlagsKeepTheOutputAndAreLogged) {
  const std::vector<std::string> base = {
      "generate",       kStoriesF32,    "--prompt", "Once upon a time", "--prompt",
      "The little dog", "--max-tokens", "40",       "--temperature",    "0",
      "--stop",         "park",         "--json"};
  auto plain = run_vesper(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("output processing asynchronous"), std::string::npos) << plain.err;
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--disable-async-output-proc", "--num-scheduler-steps", "2"},
        std::vector<std::string>{"--async-scheduling", "--num-scheduler-steps", "16"},
        std::vector<std::string>{"--no-async-scheduling", "--num-scheduler-steps", "8"}}) {
    std::vector<std::string> args = base;
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_vesper(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out) << flags[0];
    EXPECT_NE(r.err.find(flags[1] == "--num-scheduler-steps" ? flags[2] + " passes per decode step"
                                                             : "passes"),
              std::string::npos)
        << r.err;
  }
  auto ahead = run_vesper(
      {"generate", kStoriesF32, "--prompt", "x", "--max-tokens", "2", "--async-scheduling"});
  EXPECT_NE(ahead.err.find("async scheduling on"), std::string::npos) << ahead.err;
  auto spec = run_vesper({"generate", kStoriesF32, "--prompt", "x", "--async-scheduling",
                          "--speculative-model", "[ngram]", "--num-speculative-tokens", "3"});
  EXPECT_EQ(spec.exit_code, 1);
  EXPECT_NE(spec.err.find("--async-scheduling: speculative decoding"), std::string::npos)
      << spec.err;
  auto steps = run_vesper({"generate", kStoriesF32, "--prompt", "x", "--num-scheduler-steps", "0"});
  EXPECT_EQ(steps.exit_code, 2);
  EXPECT_NE(steps.err.find("--num-scheduler-steps"), std::string::npos) << steps.err;
  auto both = run_vesper(
      {"generate", kStoriesF32, "--prompt", "x", "--async-scheduling", "--no-async-scheduling"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--no-async-scheduling"), std::string::npos) << both.err;
}

TEST(CliBench, ThroughputJsonReportsRates) {
  auto r = run_vesper({"bench", "throughput", kStoriesF32, "--num-prompts", "16", "--input-len",
                       "32", "--output-len", "8", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}) {
    ASSERT_TRUE(j[key].is_number()) << key;
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(j["output_tokens"], 16 * 8);
  EXPECT_EQ(j["prompt_tokens"], 16 * 32);
  // Where the steps' time went: every phase, the shares adding up to one.
  double share = 0;
  for (const char* phase : {"schedule", "batch_build", "forward", "sample", "propose", "output"}) {
    ASSERT_TRUE(j["step_phases"][phase]["seconds"].is_number()) << phase;
    share += j["step_phases"][phase]["share"].get<double>();
  }
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_GT(j["step_phases"]["forward"]["seconds"].get<double>(), 0);
}

// The prefix-caching workloads of `bench throughput`: shared prefixes and multi-turn chats,
// with the cache on (default) and off. The engine computes far fewer prefill tokens with it.
TEST(CliBench, ThroughputPrefixCachingWorkloads) {
  auto run = [](std::vector<std::string> extra, const std::string& num_prompts = "12",
                const std::string& input_len = "8") {
    std::vector<std::string> args = {"bench",     "throughput",  kStoriesF32, "--num-prompts",
                                     num_prompts, "--input-len", input_len,   "--output-len",
                                     "6",         "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_vesper(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
  };
  const auto on = run({"--prefix-len", "96", "--num-prefixes", "2"});
  const auto off = run({"--prefix-len", "96", "--num-prefixes", "2", "--no-enable-prefix-caching"});
  ASSERT_FALSE(on.empty());
  ASSERT_FALSE(off.empty());
  EXPECT_EQ(on["prompt_tokens"], 12 * (1 + 96 + 8));
  EXPECT_EQ(on["prefix_caching"], true);
  EXPECT_EQ(off["prefix_caching"], false);
  EXPECT_EQ(off["prefill_tokens_computed"], off["prompt_tokens"]);
  EXPECT_EQ(off["prefix_cache_hit_rate"], 0.0);
  EXPECT_LT(on["prefill_tokens_computed"].get<int64_t>(),
            off["prefill_tokens_computed"].get<int64_t>() / 2);
  EXPECT_GT(on["prefix_cache_hit_rate"].get<double>(), 0.5);
  for (const char* key : {"mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"})
    EXPECT_GT(on[key].get<double>(), 0) << key;

  const auto chat = run({"--num-turns", "4"}, "3", "40");
  ASSERT_FALSE(chat.empty());
  EXPECT_EQ(chat["num_requests"], 3 * 4);
  EXPECT_EQ(chat["output_tokens"], 3 * 4 * 6);
  // Prompts of 40, 86, 132 and 178 tokens per conversation (history + 6 answer + 40 new). Turn k+1
  // finds turn k's computed tokens (prompt + answer - 1) cached in whole 16-token blocks: 32, 80
  // and 128 tokens, so it computes 40 + 54 + 52 + 50 = 196 of 436 prompt tokens.
  EXPECT_EQ(chat["prompt_tokens"], 3 * 436);
  EXPECT_EQ(chat["prefill_tokens_computed"], 3 * 196);

  auto bad = run_vesper({"bench", "throughput", kStoriesF32, "--num-turns", "0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--num-turns"), std::string::npos) << bad.err;
}

TEST(CliBench, LatencyJsonReportsPromptGenerationAndBatchedDecodeRates) {
  auto r = run_vesper({"bench", "latency", kStoriesF32, "--n-prompt", "32", "--n-gen", "8",
                       "--decode-seqs", "2,4", "--repetitions", "2", "--threads", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  // Key names follow --n-prompt / --n-gen (llama-bench's pp512 / tg128 by default).
  for (const char* test : {"pp32", "tg8", "tg8_seqs2", "tg8_seqs4"}) {
    const std::string key = std::string(test) + "_tokens_per_s";
    ASSERT_TRUE(j[key].is_number()) << key << " in " << r.out;
    const double v = j[key].get<double>();
    EXPECT_TRUE(std::isfinite(v) && v > 0) << key << " = " << v;
    EXPECT_EQ(j["samples"][test].size(), 2u) << test;
  }
  EXPECT_EQ(j["threads"], 1);
}

TEST(CliBench, LatencyBadFlagsNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--n-prompt", "-1"}, 2, "--n-prompt"},
      {{"--n-gen", "many"}, 2, "--n-gen"},
      {{"--decode-seqs", "8,0"}, 2, "--decode-seqs"},
      {{"--repetitions", "0"}, 2, "--repetitions"},
      {{"--n-prompt", "0", "--n-gen", "0"}, 1, "nothing to measure"},
      {{"--n-prompt", "64", "--max-num-batched-tokens", "32"}, 1, "--max-num-batched-tokens"},
      {{"--n-prompt", "8", "--n-gen", "4", "--decode-seqs", "4", "--max-num-seqs", "2"},
       1,
       "--max-num-seqs"},
      {{"--n-prompt", "4096"}, 1, "--n-prompt 4096"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"bench", "latency", kStoriesF32};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = run_vesper(args);
    std::string all;
    for (const auto& a : args) all += a + " ";
    EXPECT_EQ(r.exit_code, c.code) << all << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << all << "\nstderr: " << r.err;
  }
}

// Files that `vesper synth` writes in each quantized type decode in real llama.cpp to the ids
// recorded in bench/llamacpp/expected_synth_quantized.json; Vesper must agree on its own files.
TEST(CliSynth, QuantizedFilesGiveLlamaCppsGreedyIds) {
  std::ifstream f("bench/llamacpp/expected_synth_quantized.json");
  const auto expected = nlohmann::json::parse(f);
  ASSERT_GE(expected["results"].size(), 7u);
  for (const auto& r : expected["results"]) {
    const std::string path =
        ::testing::TempDir() + "vesper_synth_" + r["type"].get<std::string>() + ".gguf";
    std::vector<std::string> args = {"synth"};
    for (const auto& a : r["synth_args"]) args.push_back(a.get<std::string>());
    args.push_back("-o");
    args.push_back(path);
    auto s = run_vesper(args);
    ASSERT_EQ(s.exit_code, 0) << s.err;
    auto g = run_vesper({"generate", path, "--prompt", r["prompt"], "--max-tokens", "12",
                         "--temperature", "0", "--json"});
    ASSERT_EQ(g.exit_code, 0) << g.err;
    auto line = json_lines(g.out).at(0);
    EXPECT_EQ(line["prompt_token_ids"], r["prompt_ids"]) << r["type"];
    // Random weights leave near ties among the top logits. Both engines quantize activations
    // alike (Q8_0 / Q8_K), but llama.cpp keeps K/V in f16 and Vesper in f32, which moves a
    // top-2 gap by up to ~0.03 (measured, teacher-forced). So the ids must agree token for token
    // up to the first step where llama.cpp's recorded top-2 margin is under that; a greedy run
    // that takes the other side of such a tie then legitimately continues differently.
    constexpr double kNearTie = 0.03;
    const auto got = line["token_ids"].get<std::vector<int32_t>>();
    const auto want = r["ids"].get<std::vector<int32_t>>();
    const auto margins = r["top2_margins"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), want.size()) << r["type"];
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] == want[i]) continue;
      EXPECT_LT(margins[i], kNearTie)
          << r["type"] << ": ids differ at step " << i << " (" << got[i] << " vs llama.cpp "
          << want[i] << ") where llama.cpp's top-2 margin is " << margins[i];
      break;
    }
    std::remove(path.c_str());
  }
}

// Three prompts, written to a file for --prompts-file.
const std::vector<std::string> kThreePrompts = {"Once upon a time", "The little dog",
                                                "Lily and Tom went to the park"};
std::string write_three_prompts(const std::string& name) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream f(path);
  for (const auto& p : kThreePrompts) f << p << "\n";
  return path;
}

// A small model of weight type `type` that `vesper synth` writes to TempDir()/name (2 layers,
// 256 wide, grouped-query heads, stories260K's vocabulary): its path, or "" (the failure
// recorded) when synth fails.
std::string synth_small_model(const std::string& type, const std::string& name) {
  const std::string path = ::testing::TempDir() + name;
  auto s = run_vesper({"synth", "--n-layer", "2", "--n-embd", "256", "--n-head", "4", "--n-head-kv",
                       "2", "--n-ff", "512", "--vocab-from", kStories, "--context-length", "512",
                       "--type", type, "-o", path});
  EXPECT_EQ(s.exit_code, 0) << s.err;
  return s.exit_code == 0 ? path : "";
}

// `vesper generate MODEL` over kThreePrompts in one batch (--prompts-file) gives each prompt the
// greedy tokens it gets alone (16 of them).
void expect_batch_equals_alone(const std::string& model, const std::string& prompts_path) {
  auto batch = run_vesper({"generate", model, "--prompts-file", prompts_path, "--max-tokens", "16",
                           "--temperature", "0", "--json"});
  ASSERT_EQ(batch.exit_code, 0) << batch.err;
  const auto lines = json_lines(batch.out);
  ASSERT_EQ(lines.size(), kThreePrompts.size());
  for (size_t i = 0; i < kThreePrompts.size(); ++i) {
    auto alone = run_vesper({"generate", model, "--prompt", kThreePrompts[i], "--max-tokens", "16",
                             "--temperature", "0", "--json"});
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    const auto one = json_lines(alone.out);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(lines[i]["token_ids"].size(), 16u) << kThreePrompts[i];
    EXPECT_EQ(lines[i]["token_ids"], one[0]["token_ids"]) << kThreePrompts[i];
  }
}

// VESPER_MAX_CPU_ISA caps the kernels' instruction set (oneDNN's ONEDNN_MAX_CPU_ISA), so one CPU
// runs what a CPU without its best instructions gets: a batch of three prompts on packed q4_0 and
// q4_K weights gives the same tokens and top-2 log-probabilities on every instruction set, the
// startup log names the one in use, and a value that names none is an error naming the variable.
TEST(CliGenerate, MaxCpuIsaCapsTheKernelsWithTheSameOutput) {
  using testing_util::run_vesper_with;
  const std::string prompts_path = ::testing::TempDir() + "vesper_prompts_isa.jsonl";
  {
    std::ofstream f(prompts_path);
    for (const auto& p : kThreePrompts)
      f << nlohmann::json{{"prompt", p}, {"logprobs", 2}}.dump() << "\n";
  }
  for (const std::string type : {"q4_0", "q4_k"}) {
    SCOPED_TRACE(type);
    const std::string path = synth_small_model(type, "vesper_isa_" + type + ".gguf");
    ASSERT_FALSE(path.empty());
    const std::vector<std::string> args = {"generate",     path, "--prompts-file", prompts_path,
                                           "--max-tokens", "12", "--temperature",  "0",
                                           "--json"};
    auto best = run_vesper(args, "isa_best");
    ASSERT_EQ(best.exit_code, 0) << best.err;
    const auto want = json_lines(best.out);
    ASSERT_EQ(want.size(), kThreePrompts.size());
    for (const std::string isa : {"avx2", "scalar"}) {
      SCOPED_TRACE(isa);
      auto capped = run_vesper_with("VESPER_MAX_CPU_ISA=" + isa, args, "isa_" + isa);
      ASSERT_EQ(capped.exit_code, 0) << capped.err;
      if (isa == "scalar") {
        EXPECT_NE(capped.err.find("backend cpu (scalar"), std::string::npos) << capped.err;
      }
      const auto got = json_lines(capped.out);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i]["token_ids"], want[i]["token_ids"]) << kThreePrompts[i];
        EXPECT_EQ(got[i]["logprobs"], want[i]["logprobs"]) << kThreePrompts[i];
      }
    }
    std::remove(path.c_str());
  }
  std::remove(prompts_path.c_str());
  auto bad = run_vesper_with("VESPER_MAX_CPU_ISA=avx3", {"generate", kStories, "--prompt", "Hi"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("VESPER_MAX_CPU_ISA=\"avx3\" is not an instruction set: expected one of "
                         "scalar, avx2, avx512_vnni"),
            std::string::npos)
      << bad.err;
}

// F16 and BF16 weights (the float-contract kernels: the register-tiled GEMM for batches, the
// in-register GEMV for one or two rows) on a real model: the greedy tokens of the f32 model, and
// each prompt's tokens the same whether it runs alone or in a batch of three.
TEST(CliQuantize, F16AndBf16ModelsKeepGreedyOutputAloneAndBatched) {
  const std::string prompts_path = write_three_prompts("vesper_prompts_16bit.txt");
  auto f32 = run_vesper({"generate", kStories, "--prompt", kThreePrompts[0], "--max-tokens", "16",
                         "--temperature", "0"});
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  for (const std::string type : {"f16", "bf16"}) {
    SCOPED_TRACE(type);
    const std::string out = ::testing::TempDir() + "vesper_stories_" + type + ".gguf";
    auto q = run_vesper({"quantize", kStories, out, "--type", type});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    auto info = run_vesper({"inspect", out});
    const auto at = info.out.find("  blk.0.attn_q.weight ");
    ASSERT_NE(at, std::string::npos) << info.out;
    std::istringstream row(info.out.substr(at));
    std::string name, tensor_type;
    row >> name >> tensor_type;
    EXPECT_EQ(tensor_type, type);
    auto alone0 = run_vesper({"generate", out, "--prompt", kThreePrompts[0], "--max-tokens", "16",
                              "--temperature", "0"});
    ASSERT_EQ(alone0.exit_code, 0) << alone0.err;
    EXPECT_EQ(alone0.out, f32.out);
    expect_batch_equals_alone(out, prompts_path);
    std::remove(out.c_str());
  }
  std::remove(prompts_path.c_str());
}

// The packed k-quant kernels (q2_K ... q6_K: every matrix of this shape is repacked at load)
// through `vesper generate`: each prompt's greedy tokens are the same alone (the one-row GEMV)
// and in a batch of three (the 4-row register tiles), on models `vesper synth` writes.
TEST(CliSynth, PackedKQuantModelsGiveEachPromptItsTokensAloneAndBatched) {
  const std::string prompts_path = write_three_prompts("vesper_prompts_kquant.txt");
  for (const std::string type : {"q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}) {
    SCOPED_TRACE(type);
    const std::string path = synth_small_model(type, "vesper_packed_" + type + ".gguf");
    ASSERT_FALSE(path.empty());
    expect_batch_equals_alone(path, prompts_path);
    std::remove(path.c_str());
  }
  std::remove(prompts_path.c_str());
}

TEST(CliInspect, PrintsMetadataTensorsAndParameterCount) {
  auto r = run_vesper({"inspect", kStories});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("general.architecture"), std::string::npos);
  EXPECT_NE(r.out.find("\"llama\""), std::string::npos);
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos);
  EXPECT_NE(r.out.find("[172, 64]"), std::string::npos);
  EXPECT_NE(r.out.find("292.80K (292800)"), std::string::npos);
  EXPECT_NE(r.out.find("(512 strings)"), std::string::npos);  // the token array is elided
  auto bad = run_vesper({"inspect", "nope.gguf"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("nope.gguf"), std::string::npos);
}

TEST(CliQuantize, Q8_0ModelKeepsGreedyOutputAndLayoutRules) {
  const std::string out = ::testing::TempDir() + "vesper_stories_q8_0.gguf";
  auto q = run_vesper({"quantize", kStories, out, "--type", "q8_0"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  auto info = run_vesper({"inspect", out});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  auto type_of = [&](const std::string& name) {
    auto at = info.out.find("  " + name + " ");
    EXPECT_NE(at, std::string::npos) << name;
    std::istringstream row(info.out.substr(at));
    std::string n, type;
    row >> n >> type;
    return type;
  };
  EXPECT_EQ(type_of("blk.0.attn_q.weight"), "q8_0");
  EXPECT_EQ(type_of("token_embd.weight"), "q8_0");
  EXPECT_EQ(type_of("blk.0.ffn_down.weight"), "f16");  // 172 columns: no 32-block type fits
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), "f32");
  // 8-bit weights on this model keep the first greedy tokens of the f32 model.
  auto f32 = run_vesper({"generate", kStories, "--prompt", "Once upon a time", "--max-tokens", "8",
                         "--temperature", "0"});
  auto q8 = run_vesper(
      {"generate", out, "--prompt", "Once upon a time", "--max-tokens", "8", "--temperature", "0"});
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  EXPECT_EQ(q8.out, f32.out);
  auto bad = run_vesper({"quantize", kStories, out, "--type", "q9_9"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--type \"q9_9\""), std::string::npos);
  std::remove(out.c_str());
}

}  // namespace
}  // namespace vesper
