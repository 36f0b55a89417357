// KV sparsity through the command line on stories260K, sinks + window (--kv-sink-tokens,
// --kv-window) and Quest (--kv-sparsity quest --kv-sparse-budget): the perplexity each costs on
// held-out text, greedy ids that do not depend on batching or on n-gram speculation, an output
// longer than the KV cache (window), and bad values named in the error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "sanitized.h"

namespace vesper {
namespace {

using testing_util::kHeldoutText;
using testing_util::kStoriesF32;

using testing_util::run_vesper;

using testing_util::sanitized;  // 8 chunks, fewer settings, only what holds on any text

double perplexity_with(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"perplexity", kStoriesF32, "-f",       kHeldoutText,
                                   "--ctx",      "128",       "--chunks", sanitized() ? "8" : "40"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_vesper(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  if (!std::regex_search(r.out, m, std::regex(R"(PPL = ([0-9.]+))"))) return NAN;
  return std::stod(m[1].str());
}

// Scored rows attend as generated tokens would: a 4 + 60 window over contexts of 64..126 costs a
// little perplexity (measured +2.5% on these 40 chunks), a 4 + 32 one more (+7.3%), and a window
// covering the whole context nothing.
TEST(CliKvWindow, PerplexityGrowsAsTheWindowShrinks) {
  const double dense = perplexity_with({});
  const double wide = perplexity_with({"--kv-window", "128", "--kv-sink-tokens", "4"});
  const double w60 = perplexity_with({"--kv-window", "60", "--kv-sink-tokens", "4"});
  EXPECT_EQ(wide, dense);
  EXPECT_NE(w60, dense);
  if (sanitized()) return;
  const double w32 = perplexity_with({"--kv-window", "32", "--kv-sink-tokens", "4"});
  std::printf("  dense %.4f, 4+128 %.4f, 4+60 %.4f (%+.2f%%), 4+32 %.4f (%+.2f%%)\n", dense, wide,
              w60, 100 * (w60 / dense - 1), w32, 100 * (w32 / dense - 1));
  EXPECT_GT(w60, dense);
  EXPECT_LT(w60 / dense - 1, 0.05);
  EXPECT_GT(w32, w60);
  EXPECT_LT(w32 / dense - 1, 0.12);
}

// Quest over the same chunks: a 64-token budget (the first block, the query's own and the two
// best-bounded others) within 3% of dense (measured +2.8%), 48 more, and 32 (the first block and
// the query's own alone) far more (+70%); a budget over the whole context nothing.
TEST(CliKvQuest, PerplexityAtEachBudget) {
  const double dense = perplexity_with({});
  auto quest = [](const char* budget) {
    return perplexity_with({"--kv-sparsity", "quest", "--kv-sparse-budget", budget});
  };
  const double wide = quest("128"), b64 = quest("64");
  EXPECT_EQ(wide, dense);
  EXPECT_NE(b64, dense);
  if (sanitized()) return;
  const double b48 = quest("48"), b32 = quest("32");
  std::printf(
      "  dense %.4f, quest 128 %.4f, 64 %.4f (%+.2f%%), 48 %.4f (%+.2f%%), 32 %.4f (%+.2f%%)\n",
      dense, wide, b64, 100 * (b64 / dense - 1), b48, 100 * (b48 / dense - 1), b32,
      100 * (b32 / dense - 1));
  EXPECT_GT(b64, dense);
  EXPECT_LT(b64 / dense - 1, 0.03);
  EXPECT_GT(b48, b64);
  EXPECT_GT(b32, b48);
}

std::vector<nlohmann::json> ids(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) v.push_back(nlohmann::json::parse(line)["token_ids"]);
  return v;
}

// 200 tokens with a 4 + 16 window: the same ids alone, batched with a small token budget, and
// verified four proposals at a time by n-gram speculation (chains of rows with gaps); not the
// dense ids (the window is applied).
TEST(CliKvWindow, GreedyIdsHoldAcrossBatchingAndSpeculation) {
  const std::vector<std::string> base = {
      "generate", kStoriesF32,     "--prompt", "Once upon a time", "--max-tokens",
      "200",      "--temperature", "0",        "--ignore-eos",     "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_vesper(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  };
  const std::vector<std::string> window = {"--kv-window", "16", "--kv-sink-tokens", "4"};
  const auto alone = ids(with(window).out);
  ASSERT_EQ(alone.size(), 1u);
  std::vector<std::string> batched = window;
  for (const char* a : {"--prompt", "Lily and Ben", "--max-num-batched-tokens", "8"})
    batched.push_back(a);
  const auto b = ids(with(batched).out);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(alone[0], b[0]);
  std::vector<std::string> speculated = window;
  for (const char* a : {"--speculative-model", "[ngram]", "--num-speculative-tokens", "4"})
    speculated.push_back(a);
  const auto s = with(speculated);
  EXPECT_NE(s.err.find("n-gram"), std::string::npos) << s.err;
  EXPECT_EQ(alone[0], ids(s.out)[0]);
  EXPECT_NE(alone[0], ids(with({}).out)[0]);
}

// A cache of 12 blocks (192 tokens) runs a 400-token output with a window; without one the
// request is refused as larger than the cache.
TEST(CliKvWindow, AnOutputLongerThanTheCacheRuns) {
  const std::vector<std::string> args = {"generate",
                                         kStoriesF32,
                                         "--prompt",
                                         "Once upon a time",
                                         "--max-tokens",
                                         "400",
                                         "--temperature",
                                         "0",
                                         "--ignore-eos",
                                         "--json",
                                         "--num-gpu-blocks-override",
                                         "12",
                                         "--max-model-len",
                                         "512"};
  std::vector<std::string> windowed = args;
  for (const char* a : {"--kv-window", "32", "--kv-sink-tokens", "4"}) windowed.push_back(a);
  auto ok = run_vesper(windowed);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ids(ok.out)[0].size(), 400u);
  auto refused = run_vesper(args);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("KV cache holds"), std::string::npos) << refused.err;
}

// Quest keeps greedy ids across batching and n-gram speculation too.
TEST(CliKvQuest, GreedyIdsHoldAcrossBatchingAndSpeculation) {
  const std::vector<std::string> quest = {"--kv-sparsity", "quest", "--kv-sparse-budget", "48"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "generate", kStoriesF32,     "--prompt", "Once upon a time", "--max-tokens",
        "200",      "--temperature", "0",        "--ignore-eos",     "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_vesper(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return ids(r.out);
  };
  const auto alone = run(quest);
  std::vector<std::string> batched = quest;
  for (const char* a : {"--prompt", "Lily and Ben", "--max-num-batched-tokens", "8"})
    batched.push_back(a);
  EXPECT_EQ(alone[0], run(batched)[0]);
  std::vector<std::string> speculated = quest;
  for (const char* a : {"--speculative-model", "[ngram]", "--num-speculative-tokens", "4"})
    speculated.push_back(a);
  EXPECT_EQ(alone[0], run(speculated)[0]);
  EXPECT_NE(alone[0], run({})[0]);
}

// Quest over a KIVI cache (kivi2, groups of 32, a residual window of 32, so most of a long output's
// groups are read quantized) with a budget of 96 (the first group, one chosen, the query's own):
// the same greedy ids alone, batched with a small token budget and under n-gram speculation, not
// KIVI's dense ids; and perplexity near KIVI's dense perplexity.
TEST(CliKvQuest, OverKiviGreedyIdsHoldAndPerplexityStaysNear) {
  const std::vector<std::string> kivi = {
      "--kv-cache-dtype", "kivi2", "--kivi-group-size", "32", "--kivi-residual-length", "32"};
  std::vector<std::string> quest = kivi;
  for (const char* a : {"--kv-sparsity", "quest", "--kv-sparse-budget", "96"}) quest.push_back(a);
  auto run = [&](const std::vector<std::string>& flags, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "generate", kStoriesF32,     "--prompt", "Once upon a time", "--max-tokens",
        "200",      "--temperature", "0",        "--ignore-eos",     "--json"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_vesper(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return ids(r.out);
  };
  const auto alone = run(quest, {});
  ASSERT_EQ(alone.size(), 1u);
  EXPECT_EQ(alone[0], run(quest, {"--prompt", "Lily and Ben", "--max-num-batched-tokens", "8"})[0]);
  EXPECT_EQ(alone[0],
            run(quest, {"--speculative-model", "[ngram]", "--num-speculative-tokens", "4"})[0]);
  EXPECT_NE(alone[0], run(kivi, {})[0]);
  const double dense = perplexity_with(kivi), sparse = perplexity_with(quest);
  std::printf("  kivi2 (G 32, R 32) %.4f, with Quest 96 %.4f (%+.2f%%)\n", dense, sparse,
              100 * (sparse / dense - 1));
  EXPECT_NE(sparse, dense);
  if (!sanitized()) {
    EXPECT_LT(std::fabs(sparse / dense - 1), 0.05);
  }
}

TEST(CliKvWindow, BadValuesAreErrorsNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--kv-window", "8"}, "--kv-window 8 is below one KV block"},
      {{"--kv-sink-tokens", "4"}, "--kv-sink-tokens 4 needs --kv-window"},
      {{"--kv-window", "32", "--kv-cache-dtype", "kivi2"}, "--kv-window: not with a KIVI cache"},
      {{"--kv-window", "32", "--speculative-model", kStoriesF32, "--num-speculative-tokens", "2"},
       "--kv-window: not with a draft model"},
      {{"--kv-window", "-3"}, "--kv-window"},
      {{"--kv-sparsity", "quest"}, "--kv-sparsity quest needs --kv-sparse-budget"},
      {{"--kv-sparse-budget", "64"}, "--kv-sparse-budget 64 needs --kv-sparsity quest"},
      {{"--kv-sparsity", "quest", "--kv-sparse-budget", "16"},
       "--kv-sparse-budget 16 is below two KV blocks"},
      {{"--kv-sparsity", "quest", "--kv-sparse-budget", "64", "--kv-window", "32"},
       "one KV sparsity method at a time"},
      {{"--kv-sparsity", "sparse"}, "--kv-sparsity"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"generate", kStoriesF32,    "--prompt",
                                     "Once",     "--max-tokens", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_vesper(args);
    EXPECT_NE(r.exit_code, 0) << flags[0];
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  auto r = run_vesper({"perplexity", kStoriesF32, "-f", kHeldoutText, "--kv-window", "4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-window 4 is below one KV block"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace vesper
