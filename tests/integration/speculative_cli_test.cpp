// Speculative decoding and model widening through the `vesper` command line: n-gram, draft-model
// and Medusa speculation leave greedy output unchanged (generate, bench latency) and are reported;
// flags' and heads' errors name the flag, file or field; a widened stories260K (and its widened
// Medusa heads) compute what the originals compute.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace vesper {
namespace {

using testing_util::kStoriesF32;
using testing_util::with;

using testing_util::json_lines;
using testing_util::run_vesper;
const std::vector<std::string> kNgram = {"--speculative-model", "[ngram]",
                                         "--num-speculative-tokens", "4"};

TEST(CliSpeculative, NgramGreedyOutputEqualsPlainDecoding) {
  const std::vector<std::string> base = {"generate",
                                         kStoriesF32,
                                         "--max-tokens",
                                         "64",
                                         "--temperature",
                                         "0",
                                         "--json",
                                         "--prompt",
                                         "Once upon a time",
                                         "--prompt",
                                         "Lily had a red ball. Lily had a red ball. Lily had a",
                                         "-t",
                                         "2"};
  auto plain = run_vesper(base, "plain");
  auto speculative = run_vesper(with(base, kNgram), "spec");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(speculative.exit_code, 0) << speculative.err;
  const auto a = json_lines(plain.out), b = json_lines(speculative.out);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << i;
    EXPECT_EQ(a[i]["text"], b[i]["text"]) << i;
  }
  EXPECT_NE(speculative.err.find(
                "speculative decoding: n-gram prompt lookup (n 1..4), 4 tokens per step"),
            std::string::npos)
      << speculative.err;
}

TEST(CliSpeculative, DraftModelGreedyOutputEqualsPlainDecoding) {
  const std::vector<std::string> base = {
      "generate", kStoriesF32, "--max-tokens",     "64",       "--temperature",  "0",
      "--json",   "--prompt",  "Once upon a time", "--prompt", "The little dog", "-t",
      "2"};
  auto plain = run_vesper(base, "plain");
  auto draft = run_vesper(
      with(base,
           {"--speculative-config",
            "{\"method\": \"draft_model\", \"model\": \"../shared/models/stories-draft.gguf\", "
            "\"num_speculative_tokens\": 4}"}),
      "draft");
  ASSERT_EQ(draft.exit_code, 0) << draft.err;
  const auto a = json_lines(plain.out), b = json_lines(draft.out);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << i;
  EXPECT_NE(draft.err.find("speculative decoding: draft model ../shared/models/stories-draft.gguf "
                           "(2 layers, n_embd 48)"),
            std::string::npos)
      << draft.err;
  EXPECT_NE(draft.err.find("KV cache (f16, target + draft)"), std::string::npos) << draft.err;

  // auto measures the target's pass costs at startup and picks 0..8 tokens each step: whatever it
  // picks, greedy output is the target's.
  auto picked = run_vesper(with(base, {"--speculative-model", "../shared/models/stories-draft.gguf",
                                       "--num-speculative-tokens", "auto"}),
                           "auto");
  ASSERT_EQ(picked.exit_code, 0) << picked.err;
  const auto c = json_lines(picked.out);
  ASSERT_EQ(c.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["token_ids"], c[i]["token_ids"]) << i;
  EXPECT_NE(picked.err.find("auto: 0..8 tokens per step (a target pass of 1 row "),
            std::string::npos)
      << picked.err;
}

TEST(CliSpeculative, BenchLatencyReportsAcceptance) {
  auto r = run_vesper(with(
      {"bench", "latency", kStoriesF32, "-p", "0", "-n", "32", "-r", "1", "--json", "-t", "2",
       "--prompt", "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had a"},
      kNgram));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("speculative")) << r.out;
  const auto& s = j["speculative"]["tg32"];
  EXPECT_GT(s["draft_tokens"].get<int64_t>(), 0);
  EXPECT_GE(s["acceptance_rate"].get<double>(), 0.0);
  EXPECT_LE(s["acceptance_rate"].get<double>(), 1.0);
  EXPECT_GE(s["tokens_per_target_pass"].get<double>(), 1.0);
}

// bench throughput with the draft model: every request's tokens, and the speculation counters
// (each target pass keeps at least its own token, so more than 1 token per pass when any proposal
// holds).
TEST(CliSpeculative, BenchThroughputReportsAcceptance) {
  auto r = run_vesper({"bench", "throughput", kStoriesF32, "--num-prompts", "8", "--input-len",
                       "16", "--output-len", "16", "--json", "-t", "2", "--speculative-model",
                       "../shared/models/stories-draft.gguf", "--num-speculative-tokens", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_tokens"], 8 * 16);
  ASSERT_TRUE(j.contains("speculative")) << r.out;
  const auto& s = j["speculative"];
  EXPECT_GT(s["draft_tokens"].get<int64_t>(), 0);
  EXPECT_LE(s["accepted_tokens"].get<int64_t>(), s["draft_tokens"].get<int64_t>());
  EXPECT_GT(s["tokens_per_target_pass"].get<double>(), 1.0);
}

// ADAPTERS.md measured 3.96 tokens per target pass for the draft at k = 4 (greedy, 8-token
// prompts, 96 tokens each); the issue asks for at least 3.5. Greedy decoding makes this exact:
// the figure cannot drift from run to run.
TEST(CliSpeculative, DraftKeepsAtLeastThreeAndAHalfTokensPerTargetPass) {
  auto r = run_vesper({"bench", "latency", kStoriesF32, "-p", "0", "-n", "96", "-r", "1", "--json",
                       "-t", "2", "--prompt", "Once upon a time", "--speculative-model",
                       "../shared/models/stories-draft.gguf", "--num-speculative-tokens", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto s = nlohmann::json::parse(r.out)["speculative"]["tg96"];
  EXPECT_GE(s["tokens_per_target_pass"].get<double>(), 3.5) << s.dump();
  EXPECT_NEAR(s["proposals_per_pass"].get<double>(), 4.0, 0.1) << s.dump();
}

TEST(CliSpeculative, BadFlagsNameTheFlag) {
  const std::vector<std::string> gen = {"generate", kStoriesF32,    "--prompt",
                                        "Hi",       "--max-tokens", "4"};
  struct Case {
    std::vector<std::string> extra;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--speculative-model", "[ngram]"}, 1, "--num-speculative-tokens is required"},
      {{"--speculative-model", "[ngram]", "--num-speculative-tokens", "0"},
       1,
       "--num-speculative-tokens must be a positive integer (at most 1024) or \"auto\", got \"0\""},
      {{"--speculative-model", "[ngram]", "--num-speculative-tokens", "sometimes"},
       1,
       "--num-speculative-tokens must be a positive integer"},
      {{"--speculative-model", "[ngram]", "--num-speculative-tokens", "3",
        "--ngram-prompt-lookup-min", "5", "--ngram-prompt-lookup-max", "2"},
       1,
       "--ngram-prompt-lookup-min 5 exceeds --ngram-prompt-lookup-max 2"},
      {{"--num-speculative-tokens", "3"}, 1, "--num-speculative-tokens needs --speculative-model"},
      {{"--speculative-model", "../shared/models/medusa", "--num-speculative-tokens", "3",
        "--ngram-prompt-lookup-min", "2"},
       1,
       "--ngram-prompt-lookup-min applies to \"[ngram]\", not to Medusa heads"},
      {{"--speculative-config", "{\"method\": \"medusa\", \"num_speculative_tokens\": 3}"},
       1,
       "method medusa needs \"model\""},
      {{"--speculative-config",
        "{\"method\": \"medusa\", \"model\": \"../shared/models/medusa\", "
        "\"num_speculative_tokens\": 3, \"medusa_tree\": 1}"},
       1,
       "\"medusa_tree\" must be true or false"},
      {{"--speculative-model", "no-such-draft.gguf", "--num-speculative-tokens", "3"},
       1,
       "--speculative-model no-such-draft.gguf: no such file"},
      {{"--speculative-model", "../shared/models/stories-draft.gguf", "--num-speculative-tokens",
        "3", "--ngram-prompt-lookup-max", "3"},
       1,
       "--ngram-prompt-lookup-max applies to \"[ngram]\", not to a draft model"},
      {{"--speculative-model", "../shared/models/llama-2-tiny-random.gguf",
        "--num-speculative-tokens", "3"},
       1,
       "have different vocabularies: token"},
      {{"--speculative-config", "{\"method\": \"ngram\", \"num_speculative_tokens\": -1}"},
       1,
       "\"num_speculative_tokens\" must be a positive integer"},
      {{"--speculative-config", "{\"method\": \"ngram\", \"k\": 2}"}, 1, "unknown key \"k\""},
      {{"--speculative-config", "[1]"}, 1, "--speculative-config must be a JSON object"},
      {{"--speculative-model", "[ngram]", "--num-speculative-tokens", "2",
        "--spec-decoding-acceptance-method", "best"},
       2,
       "--spec-decoding-acceptance-method"},
  };
  for (const Case& c : cases) {
    auto r = run_vesper(with(gen, c.extra));
    EXPECT_EQ(r.exit_code, c.exit_code) << c.message << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  // The JSON form works as the flags do.
  auto ok = run_vesper(with(
      gen, {"--speculative-config",
            "{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 2}"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("n-gram prompt lookup (n 1..2), 3 tokens per step"), std::string::npos)
      << ok.err;
}

TEST(CliSpeculative, BadMedusaHeadsAreStartupErrorsNamingFileAndField) {
  const std::string dir = ::testing::TempDir() + "vesper_bad_medusa";
  std::filesystem::create_directories(dir);
  auto start = [&](const std::string& model, const std::string& heads) {
    return run_vesper({"generate", model, "--prompt", "Hi", "--max-tokens", "2",
                       "--speculative-model", heads, "--num-speculative-tokens", "3"});
  };
  // Heads for another hidden size.
  auto wrong = start("../shared/models/llama-2-tiny-random.gguf", "../shared/models/medusa");
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_NE(wrong.err.find("medusa/config.json: \"hidden_size\" 64 does not match"),
            std::string::npos)
      << wrong.err;
  // A config without medusa_num_heads.
  std::ofstream(dir + "/config.json") << R"({"hidden_size": 64})";
  std::ofstream(dir + "/heads.safetensors") << "not a safetensors file at all";
  auto no_heads = start(kStoriesF32, dir);
  EXPECT_EQ(no_heads.exit_code, 1);
  EXPECT_NE(no_heads.err.find("config.json: no \"medusa_num_heads\""), std::string::npos)
      << no_heads.err;
  // Bad safetensors.
  std::ofstream(dir + "/config.json") << R"({"medusa_num_heads": 4, "hidden_size": 64})";
  auto bad = start(kStoriesF32, dir);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("heads.safetensors: safetensors header of"), std::string::npos) << bad.err;
}

TEST(CliSpeculative, MedusaGreedyOutputEqualsPlainAndWidenedHeadsProposeTheSame) {
  const std::vector<std::string> gen = {
      "--max-tokens",     "48",       "--temperature",  "0",  "--json", "--prompt",
      "Once upon a time", "--prompt", "The little dog", "-t", "2"};
  const std::vector<std::string> medusa = {"--speculative-model", "../shared/models/medusa",
                                           "--num-speculative-tokens", "8"};
  auto plain = run_vesper(with({"generate", kStoriesF32}, gen), "plain");
  auto heads = run_vesper(with(with({"generate", kStoriesF32}, gen), medusa), "medusa");
  ASSERT_EQ(heads.exit_code, 0) << heads.err;
  const auto a = json_lines(plain.out), b = json_lines(heads.out);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << i;
  EXPECT_NE(heads.err.find("Medusa heads ../shared/models/medusa/stories260K-medusa4.safetensors "
                           "(4 heads in f32, a tree of candidates), 8 tokens per step"),
            std::string::npos)
      << heads.err;

  // Widened model and widened heads: the same output, and the same proposals (so the same
  // acceptance), as the originals.
  const std::string wide_model = ::testing::TempDir() + "vesper_widened_medusa.gguf";
  const std::string wide_heads = ::testing::TempDir() + "vesper_widened_heads";
  ASSERT_EQ(run_vesper({"synth", "--widen-from", kStoriesF32, "--n-embd", "256", "--n-head", "32",
                        "--n-head-kv", "16", "--n-ff", "512", "-o", wide_model})
                .exit_code,
            0);
  auto w = run_vesper(
      {"synth", "--widen-medusa", "../shared/models/medusa", "--n-embd", "256", "-o", wide_heads});
  ASSERT_EQ(w.exit_code, 0) << w.err;
  auto bench = [&](const std::string& model, const std::string& dir) {
    auto r = run_vesper({"bench", "latency", model, "-p", "0", "-n", "48", "-r", "1", "--json",
                         "-t", "2", "--prompt", "Once upon a time", "--speculative-model", dir,
                         "--num-speculative-tokens", "6"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["speculative"]["tg48"];
  };
  const auto original = bench(kStoriesF32, "../shared/models/medusa");
  const auto widened = bench(wide_model, wide_heads);
  EXPECT_EQ(original["draft_tokens"], widened["draft_tokens"]);
  EXPECT_EQ(original["accepted_tokens"], widened["accepted_tokens"]);
  EXPECT_GT(original["accepted_tokens"].get<int64_t>(), 0);
  auto small = run_vesper(
      {"synth", "--widen-medusa", "../shared/models/medusa", "--n-embd", "32", "-o", wide_heads});
  EXPECT_NE(small.err.find("--n-embd 32 is smaller than the heads' hidden_size 64"),
            std::string::npos)
      << small.err;
}

TEST(CliSynth, AWidenedModelComputesWhatTheOriginalDoes) {
  const std::string widened = ::testing::TempDir() + "vesper_widened.gguf";
  for (const std::string type : {"f32", "q8_0"}) {
    auto w = run_vesper({"synth", "--widen-from", kStoriesF32, "--n-embd", "256", "--n-head", "32",
                         "--n-head-kv", "16", "--n-ff", "512", "--type", type, "-o", widened});
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const std::vector<std::string> gen = {
        "--prompt", "Once upon a time", "--max-tokens", "48", "--temperature", "0", "--json"};
    auto original = run_vesper(with({"generate", kStoriesF32}, gen), "orig");
    auto wide = run_vesper(with({"generate", widened}, gen), "wide");
    ASSERT_EQ(wide.exit_code, 0) << wide.err;
    EXPECT_EQ(json_lines(original.out)[0]["token_ids"], json_lines(wide.out)[0]["token_ids"])
        << type;
  }
  auto bad = run_vesper({"synth", "--widen-from", kStoriesF32, "--n-embd", "256", "--n-head", "32",
                         "--n-head-kv", "8", "--n-ff", "512", "-o", widened});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("query heads per KV head"), std::string::npos) << bad.err;
  auto small = run_vesper({"synth", "--widen-from", kStoriesF32, "--n-embd", "32", "--n-head", "8",
                           "--n-head-kv", "4", "--n-ff", "512", "-o", widened});
  EXPECT_NE(small.err.find("--n-embd 32 is smaller than"), std::string::npos) << small.err;
}

}  // namespace
}  // namespace vesper
