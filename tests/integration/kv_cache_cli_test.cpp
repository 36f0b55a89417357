// The KV cache types through the command line on a real model: `vesper perplexity` per type
// (the accuracy each costs on held-out text in stories260K's domain), the KL divergence against
// a saved f32 base, the capacity a fixed --kv-cache-memory holds per type, llama.cpp's -ctk /
// -ctv spellings, and bad values named in the error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "sanitized.h"

namespace vesper {
namespace {

using testing_util::kHeldoutText;
using testing_util::kStoriesF32;

using testing_util::run_vesper;

double number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(pattern))) return NAN;
  return std::stod(m[1].str());
}

using testing_util::sanitized;

// PPL on the first 60 chunks of 128 tokens (3,780 scored tokens). Under a sanitizer 6 chunks, and
// the tests check memory, not the figures' bounds (measured on the 60).
double perplexity(const std::string& kv_type, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"perplexity",
                                   kStoriesF32,
                                   "-f",
                                   kHeldoutText,
                                   "--ctx",
                                   "128",
                                   "--chunks",
                                   sanitized() ? "6" : "60",
                                   "--kv-cache-dtype",
                                   kv_type};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_vesper(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return number_after(r.out, R"(PPL = ([0-9.]+))");
}

TEST(CliKvCache, PerplexityOfEachTypeStaysNearF32) {
  const double f32 = perplexity("f32");
  ASSERT_GT(f32, 2.0);
  if (!sanitized()) {
    ASSERT_LT(f32, 10.0);
  }
  // Measured on the whole corpus (bench/RESULTS.md): f16 +0.00%, bf16 +0.005%, int8 +0.08%,
  // fp8_e4m3 +0.79%, fp8_e5m2 +3.4% (head size 8: a scale per 8 elements).
  const std::map<std::string, double> bound = {
      {"f16", 0.001}, {"bf16", 0.003}, {"int8", 0.005}, {"fp8_e4m3", 0.015}, {"fp8_e5m2", 0.06}};
  for (const auto& [type, tolerance] : bound) {
    const double ppl = perplexity(type);
    std::printf("  %-9s PPL %.4f (f32 %.4f, %+.3f%%)\n", type.c_str(), ppl, f32,
                100 * (ppl / f32 - 1));
    EXPECT_TRUE(std::isfinite(ppl) && ppl > 1) << type;
    if (!sanitized()) {
      EXPECT_LT(std::fabs(ppl / f32 - 1), tolerance) << type;
    }
  }
}

// --calculate-kv-scales: fp8 scales fixed per layer and head from the first chunk's rows instead
// of each row's own. Measured here (60 chunks): fp8_e4m3 +2.2% against f32 (per-row scales:
// +0.8%), the reason per-row scales are the default. The engine logs the calibration; a type
// without fp8 is refused, naming the flag.
TEST(CliKvCache, CalculateKvScalesFixesFp8ScalesFromTheFirstRows) {
  const double f32 = perplexity("f32");
  const double own = perplexity("fp8_e4m3");
  const double calibrated = perplexity("fp8_e4m3", {"--calculate-kv-scales"});
  std::printf("  fp8_e4m3 PPL %.4f, calibrated %.4f (f32 %.4f)\n", own, calibrated, f32);
  if (!sanitized()) {
    EXPECT_LT(std::fabs(calibrated / f32 - 1), 0.05);
  }
  EXPECT_NE(calibrated, own) << "the flag changed nothing";
  auto gen = run_vesper({"generate", kStoriesF32, "--prompt", "Once upon a time", "--max-tokens",
                         "20", "--kv-cache-dtype", "fp8", "--calculate-kv-scales"});
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_NE(gen.err.find("fixed from the first step's rows (--calculate-kv-scales)"),
            std::string::npos)
      << gen.err;
  auto bad = run_vesper({"generate", kStoriesF32, "--prompt", "Once", "--kv-cache-dtype", "int8",
                         "--calculate-kv-scales"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--calculate-kv-scales applies to fp8 KV caches"), std::string::npos)
      << bad.err;
}

// KIVI with the issue's setting (groups of 32, a residual window of 32, so most of each 128-token
// window is read quantized): measured on the whole corpus (bench/RESULTS.md) kivi4 +0.02%,
// kivi2 +4.0%. A residual window as long as the context quantizes nothing: f16's perplexity.
TEST(CliKvCache, KiviPerplexityWithinItsBounds) {
  const double f32 = perplexity("f32");
  const double f16 = perplexity("f16");
  const std::vector<std::string> window = {"--kivi-group-size", "32", "--kivi-residual-length",
                                           "32"};
  const double kivi4 = perplexity("kivi4", window), kivi2 = perplexity("kivi2", window);
  std::printf("  kivi4 %+.3f%%, kivi2 %+.3f%% of f32\n", 100 * (kivi4 / f32 - 1),
              100 * (kivi2 / f32 - 1));
  EXPECT_EQ(f16, perplexity("kivi2", {"--kivi-residual-length", "128"}));
  // Keys and values apart (K8V2), and int8 keys with f16 values between f16 and kivi2.
  const double k8v2 = perplexity("kivi2", {"--kv-cache-dtype-k", "int8", "--kivi-group-size", "32",
                                           "--kivi-residual-length", "32"});
  EXPECT_TRUE(std::isfinite(k8v2) && std::isfinite(kivi2) && std::isfinite(kivi4));
  if (sanitized()) return;
  EXPECT_LT(std::fabs(kivi4 / f32 - 1), 0.01);
  EXPECT_LT(std::fabs(kivi2 / f32 - 1), 0.08);
  EXPECT_GT(kivi2, kivi4) << "2 bits cost more than 4";
  EXPECT_GT(kivi2 / f32 - 1, 0.005) << "kivi2 with a window of 32 quantizes most keys";
  EXPECT_LT(k8v2, kivi2);
  EXPECT_GE(k8v2, f16 * 0.999);
}

// What KIVI does not run with yet is a startup error naming the flags (speculative decoding), or
// said in the startup log (prefix caching, turned off); a bad group size is a usage error.
TEST(CliKvCache, KiviLimitsAreStatedNamingTheFlags) {
  // A residual window of 0 (every whole group read quantized) runs past a group's end.
  auto zero = run_vesper({"generate", kStoriesF32, "--prompt", "Once upon a time", "--max-tokens",
                          "100", "--kv-cache-dtype", "kivi2", "--kivi-residual-length", "0"});
  EXPECT_EQ(zero.exit_code, 0) << zero.err;
  auto ok = run_vesper({"generate", kStoriesF32, "--prompt", "Once", "--max-tokens", "2",
                        "--kv-cache-dtype", "kivi2"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  auto bad = run_vesper({"perplexity", kStoriesF32, "-f", kHeldoutText, "--kv-cache-dtype", "kivi2",
                         "--kivi-group-size", "48"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kivi-group-size"), std::string::npos) << bad.err;
}

TEST(CliKvCache, KlDivergenceAgainstAnF32Base) {
  const std::string base = ::testing::TempDir() + "/stories-f32.kld";
  auto saved =
      run_vesper({"perplexity", kStoriesF32, "-f", kHeldoutText, "--ctx", "128", "--chunks", "20",
                  "--kv-cache-dtype", "f32", "--kl-divergence-base", base});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  // Against itself: zero divergence, the same top token everywhere.
  auto same = run_vesper({"perplexity", kStoriesF32, "--ctx", "128", "--kv-cache-dtype", "f32",
                          "--kl-divergence-base", base, "--kl-divergence"});
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(0.0, number_after(same.out, R"(Mean KLD = ([0-9.]+))")) << same.out;
  EXPECT_NE(same.out.find("Same top token: 100.000%"), std::string::npos) << same.out;
  double previous = 0;
  for (const std::string type : {"f16", "int8", "fp8_e4m3"}) {
    auto r = run_vesper({"perplexity", kStoriesF32, "--ctx", "128", "--kv-cache-dtype", type,
                         "--kl-divergence-base", base, "--kl-divergence"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const double kl = number_after(r.out, R"(Mean KLD = ([0-9.]+))");
    const double top = number_after(r.out, R"(Same top token: ([0-9.]+)%)");
    std::printf("  %-9s mean KLD %.6f, same top token %.2f%%\n", type.c_str(), kl, top);
    EXPECT_GT(kl, previous) << type << ": coarser types diverge more";
    EXPECT_LT(kl, 0.02) << type;
    EXPECT_GT(top, type == "f16" ? 99.5 : type == "int8" ? 97.0 : 90.0) << type;
    previous = kl;
  }
  // A base from another context length is refused, naming the flag.
  auto wrong = run_vesper(
      {"perplexity", kStoriesF32, "--ctx", "64", "--kl-divergence-base", base, "--kl-divergence"});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("--kl-divergence-base"), std::string::npos) << wrong.err;
  // A header that promises more than the file holds (a huge chunk count) is refused, not
  // allocated; so is a file cut short.
  {
    std::ifstream in(base, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const int64_t huge = int64_t{1} << 40;
    std::string lying = bytes;
    std::memcpy(lying.data() + 24, &huge, sizeof(huge));  // n_chunks, after magic, ctx, n_vocab
    for (const std::string& corrupt : {lying, bytes.substr(0, bytes.size() - 5)}) {
      const std::string path = ::testing::TempDir() + "/corrupt.kld";
      std::ofstream(path, std::ios::binary) << corrupt;
      auto r = run_vesper({"perplexity", kStoriesF32, "--ctx", "128", "--kl-divergence-base", path,
                           "--kl-divergence"});
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.err.find("corrupt or truncated"), std::string::npos) << r.err;
      std::remove(path.c_str());
    }
  }
  std::remove(base.c_str());
}

// Tokens of capacity a 1 MiB KV cache holds, from the startup log's memory plan.
double capacity(const std::vector<std::string>& kv_flags, std::string* log = nullptr) {
  std::vector<std::string> args = {"generate",          kStoriesF32, "--prompt",      "Once",
                                   "--max-tokens",      "4",         "--temperature", "0",
                                   "--kv-cache-memory", "1M"};
  args.insert(args.end(), kv_flags.begin(), kv_flags.end());
  auto r = run_vesper(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (log != nullptr) *log = r.err;
  return number_after(r.err, R"(blocks = [0-9.]+ [KMG]iB \(([0-9]+) tokens)");
}

TEST(CliKvCache, SameMemoryHoldsMoreTokensOfSmallerTypes) {
  const double f32 = capacity({"--kv-cache-dtype", "f32"});
  ASSERT_GT(f32, 0);
  EXPECT_EQ(2 * f32, capacity({"--kv-cache-dtype", "f16"}));
  EXPECT_EQ(2 * f32, capacity({}));  // auto = f16
  // Head size 8: an int8 row is 8 bytes + 4 of scale and zero point, against 32 in f32.
  EXPECT_NEAR(32.0 / 12.0, capacity({"--kv-cache-dtype", "int8"}) / f32, 0.03);
  EXPECT_NEAR(32.0 / 10.0, capacity({"--kv-cache-dtype", "fp8"}) / f32, 0.03);
  // Keys and values apart, llama.cpp's spelling: (32 + 32) / (12 + 16).
  std::string log;
  EXPECT_NEAR(64.0 / 28.0, capacity({"-ctk", "int8", "-ctv", "f16"}, &log) / f32, 0.03);
  EXPECT_NE(log.find("KV cache (k int8, v f16)"), std::string::npos) << log;
  // KIVI, scales and zero points included (groups of 32, head size 8): kivi2 a group's keys
  // 8 x 4 + 32 x 2 bytes and values 32 x (2 + 4), 9 bytes a token and head against f32's 64;
  // kivi4 13.
  EXPECT_NEAR(64.0 / 9.0, capacity({"--kv-cache-dtype", "kivi2"}, &log) / f32, 0.1);
  EXPECT_NE(log.find("KV cache (kivi2) 180 bytes/token"), std::string::npos) << log;
  EXPECT_NEAR(64.0 / 13.0, capacity({"--kv-cache-dtype", "kivi4"}) / f32, 0.1);
}

// With KIVI the startup log's sequences at once count each sequence's f16 residual window at its
// largest, and that many full-length sequences decode side by side without preemption. stories260K
// (head size 8) at 128 tokens: a kivi2 group takes one 5,760-byte block quantized and 6 as residual
// rows. At R 32 a 128-token sequence holds the most at its 97th token: groups 0-1 quantized, 2-3
// residual, 2 + 2 x 6 = 14 blocks. So 42 blocks hold 3 sequences, and 41 do not.
TEST(CliKvCache, KiviPlanCountsTheResidualWindowsDecodingHolds) {
  auto run = [](int64_t blocks, std::string* log) {
    auto r = run_vesper({"bench", "throughput", kStoriesF32, "--num-prompts", "3", "--input-len",
                         "8", "--output-len", "120", "--kv-cache-dtype", "kivi2",
                         "--kivi-residual-length", "32", "--max-model-len", "128",
                         "--kv-cache-memory", std::to_string(blocks * 5760), "-t", "1"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    *log = r.out + r.err;
    return number_after(*log, R"(preemptions: ([0-9]+))");
  };
  std::string log;
  EXPECT_EQ(0, run(42, &log)) << log;
  EXPECT_NE(log.find("42 blocks"), std::string::npos) << log;
  EXPECT_NE(log.find("1344 tokens quantized, 3.00 sequences of max-model-len 128 at once"),
            std::string::npos)
      << log;
  EXPECT_GT(run(41, &log), 0) << log;
  EXPECT_NE(log.find("2.93 sequences of max-model-len 128 at once"), std::string::npos) << log;
}

// `vesper inspect` states a model's KV bytes per token in every type (stories260K: 5 layers x 4 KV
// heads x 8, keys and values: f32 1,280 bytes, f16 640, int8 5 x 4 x 2 x (8 + 4) = 480).
TEST(CliKvCache, InspectListsTheKvCostOfEveryType) {
  auto r = run_vesper({"inspect", kStoriesF32, "--no-tensors"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("KV cache per token"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(f32 +1.25 KiB/token +838861 tokens per GiB)")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(f16 +640 B/token .*\(auto\))"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(int8 +480 B/token)"))) << r.out;
}

// bench latency -d decodes after a prompt of that many tokens and names its tests as llama-bench
// does; its JSON states the KV cache it ran with.
TEST(CliKvCache, BenchLatencyAtDepthReportsTheKvCache) {
  auto r = run_vesper({"bench", "latency", kStoriesF32, "-p", "0", "-n", "4", "-d", "64",
                       "--decode-seqs", "2", "-r", "1", "-t", "1", "--kv-cache-dtype", "int8",
                       "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j.value("tg4_d64_tokens_per_s", 0.0), 0) << r.out;
  EXPECT_GT(j.value("tg4_seqs2_d64_tokens_per_s", 0.0), 0) << r.out;
  EXPECT_EQ(j["kv_cache"]["dtype"], "int8") << r.out;
  EXPECT_EQ(j["kv_cache"]["bytes_per_token"], 480) << r.out;
  EXPECT_EQ(j["kv_cache"]["tokens"].get<double>() / j["kv_cache"]["max_model_len"].get<double>(),
            j["kv_cache"]["sequences_at_once"].get<double>())
      << r.out;
  EXPECT_EQ(j["prefix_cache"]["hits"], 0) << "random prompts of their own shared a block";
  // --shared-prompt: the sequences share one prompt, prefilled once and then found in the prefix
  // cache: each of the 6 sequences of the 4 runs (a warm-up and a timed run with 1 and with 2)
  // finds at least 48 of its 64 tokens there.
  auto shared =
      run_vesper({"bench", "latency", kStoriesF32, "-p", "0", "-n", "4", "-d", "64",
                  "--decode-seqs", "2", "-r", "1", "-t", "1", "--shared-prompt", "--json"});
  ASSERT_EQ(shared.exit_code, 0) << shared.err;
  const auto js = nlohmann::json::parse(shared.out);
  EXPECT_GT(js.value("tg4_seqs2_d64_tokens_per_s", 0.0), 0) << shared.out;
  EXPECT_GE(js["prefix_cache"]["hits"].get<int64_t>(), 6 * 48) << shared.out;
  auto alone =
      run_vesper({"bench", "latency", kStoriesF32, "-p", "0", "-n", "4", "--shared-prompt"});
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.err.find("--shared-prompt needs --n-depth or --prompt"), std::string::npos)
      << alone.err;
  // A depth beyond the context length is an error, not a crash.
  auto deep = run_vesper(
      {"bench", "latency", kStoriesF32, "-p", "0", "-n", "4", "-d", "100000", "-r", "1", "--json"});
  EXPECT_NE(deep.exit_code, 0);
  EXPECT_NE(deep.err.find("--n-depth 100000"), std::string::npos) << deep.err;
}

// Each type's greedy ids for a prompt alone equal its ids inside a batch with a tiny token budget
// (chunked prefill beside decodes).
TEST(CliKvCache, GreedyOutputPerTypeIsTheSameAloneAndBatched) {
  auto ids = [](const std::string& out) {
    std::vector<nlohmann::json> v;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) v.push_back(nlohmann::json::parse(line)["token_ids"]);
    return v;
  };
  // KIVI with a residual window of 8 over 60 tokens: groups are stored quantized as it runs.
  for (const std::string type : {"f16", "int8", "fp8_e5m2", "kivi2", "kivi4"}) {
    const std::string max_tokens = type.starts_with("kivi") ? "60" : "24";
    auto alone = run_vesper({"generate", kStoriesF32, "--prompt", "Lily wanted a", "--max-tokens",
                             max_tokens, "--temperature", "0", "--json", "--kv-cache-dtype", type,
                             "--kivi-residual-length", "8"});
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    auto batched = run_vesper({"generate", kStoriesF32, "--prompt", "One day, a big dog",
                               "--prompt", "Lily wanted a", "--max-tokens", max_tokens,
                               "--temperature", "0", "--json", "--max-num-batched-tokens", "8",
                               "--kv-cache-dtype", type, "--kivi-residual-length", "8"});
    ASSERT_EQ(batched.exit_code, 0) << batched.err;
    const auto a = ids(alone.out), b = ids(batched.out);
    ASSERT_EQ(1u, a.size());
    ASSERT_EQ(2u, b.size());
    EXPECT_EQ(a[0], b[1]) << type;
  }
}

// Generates greedily from `prompt` and "Lily and Ben" over kivi2 with a residual window of
// `residual` (and `extra` flags), without and with the speculation flags `spec`: the ids must be
// equal, and the speculated run's log mention `log`. Returns the speculated run.
testing_util::CommandResult expect_speculation_keeps_ids(const std::string& prompt,
                                                         const std::string& residual,
                                                         const std::vector<std::string>& extra,
                                                         const std::vector<std::string>& spec,
                                                         const std::string& log) {
  std::vector<std::string> args = {"generate",      kStoriesF32,
                                   "--prompt",      prompt,
                                   "--prompt",      "Lily and Ben",
                                   "--max-tokens",  "100",
                                   "--temperature", "0",
                                   "--json",        "--kv-cache-dtype",
                                   "kivi2",         "--kivi-residual-length",
                                   residual};
  args.insert(args.end(), extra.begin(), extra.end());
  auto plain = run_vesper(args);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  args.insert(args.end(), spec.begin(), spec.end());
  auto speculated = run_vesper(args);
  EXPECT_EQ(speculated.exit_code, 0) << speculated.err;
  EXPECT_NE(speculated.err.find(log), std::string::npos) << speculated.err;
  EXPECT_EQ(plain.out, speculated.out);
  return speculated;
}

// n-gram speculation verifies chains of proposals over a KIVI cache: the greedy ids are those
// of plain decoding (groups are stored quantized meanwhile: a residual window of 8).
TEST(CliKvCache, KiviGreedyOutputIsTheSameWithNgramSpeculation) {
  expect_speculation_keeps_ids("Once upon a time", "8", {},
                               {"--speculative-model", "[ngram]", "--num-speculative-tokens", "4"},
                               "n-gram");
}

// Medusa's candidate trees over a KIVI cache: each tree row reads the quantized groups, then its
// own path as written, and the accepted rows move to their positions through the residual blocks'
// slots: the greedy ids equal plain decoding's. A residual window no longer than the trees are
// deep is refused, naming the flag.
TEST(CliKvCache, KiviGreedyOutputIsTheSameWithMedusaHeads) {
  const std::vector<std::string> medusa = {"--speculative-model", "../shared/models/medusa",
                                           "--num-speculative-tokens", "8"};
  expect_speculation_keeps_ids("Once upon a time", "8", {}, medusa, "Medusa heads");
  std::vector<std::string> shallow = {"generate",
                                      kStoriesF32,
                                      "--prompt",
                                      "Hi",
                                      "--kv-cache-dtype",
                                      "kivi2",
                                      "--kivi-residual-length",
                                      "4"};
  shallow.insert(shallow.end(), medusa.begin(), medusa.end());
  auto r = run_vesper(shallow);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kivi-residual-length 4"), std::string::npos) << r.err;
}

// A draft model over a KIVI cache: its cache follows the target's tables (as many residual rows a
// block), its rows of a group are quantized with the target's, and a group waits for the draft's
// rows (prompts prefilled in chunks of 16 tokens, a residual window of 8, before the draft has
// seen them): the greedy ids equal plain decoding's.
TEST(CliKvCache, KiviGreedyOutputIsTheSameWithADraftModel) {
  expect_speculation_keeps_ids(
      "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun "
      "with her friends and her dog.",
      "8", {"--max-num-batched-tokens", "16"},
      {"--speculative-model", "../shared/models/stories-draft.gguf", "--num-speculative-tokens",
       "3"},
      "draft model");
  // The draft reads its own rows in the quantized groups: 3.56 tokens per target pass here (f16:
  // 4.36); with the groups' draft rows never quantized (garbage read back), 3.2.
  auto bench = run_vesper({"bench",
                           "latency",
                           "../shared/models/stories260K.gguf",
                           "-p",
                           "0",
                           "-n",
                           "96",
                           "-r",
                           "1",
                           "--json",
                           "-t",
                           "2",
                           "--prompt",
                           "Once upon a time",
                           "--speculative-model",
                           "../shared/models/stories-draft.gguf",
                           "--num-speculative-tokens",
                           "4",
                           "--kv-cache-dtype",
                           "kivi2",
                           "--kivi-residual-length",
                           "8"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const auto s = nlohmann::json::parse(bench.out)["speculative"]["tg96"];
  EXPECT_GE(s["tokens_per_target_pass"].get<double>(), 3.4) << s.dump();
}

// KIVI with the prefix cache: prompts sharing a long prefix, one at a time, so that later ones
// start from the first one's cached residual groups (released by its compaction, a residual
// window of 8): the greedy ids equal those with the cache off; and `bench throughput` over
// shared prefixes reports hits.
TEST(CliKvCache, KiviPrefixCachingHitsAndKeepsGreedyOutput) {
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and ran to get it. "
      "Her mom said to be careful, so Lily looked both ways before she ran.";
  std::vector<std::string> args = {"generate",
                                   kStoriesF32,
                                   "--prompt",
                                   prefix + " Then",
                                   "--prompt",
                                   prefix + " The ball",
                                   "--prompt",
                                   prefix + " Lily smiled",
                                   "--max-tokens",
                                   "40",
                                   "--temperature",
                                   "0",
                                   "--json",
                                   "--max-num-seqs",
                                   "1",
                                   "--kv-cache-dtype",
                                   "kivi2",
                                   "--kivi-residual-length",
                                   "8"};
  auto on = run_vesper(args);
  ASSERT_EQ(on.exit_code, 0) << on.err;
  EXPECT_NE(on.err.find("prefix caching on"), std::string::npos) << on.err;
  args.push_back("--no-enable-prefix-caching");
  auto off = run_vesper(args);
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_EQ(on.out, off.out);
  auto bench = run_vesper({"bench", "throughput", kStoriesF32, "--num-prompts", "8", "--prefix-len",
                           "96", "--num-prefixes", "2", "--input-len", "16", "--output-len", "8",
                           "--kv-cache-dtype", "kivi2", "--kivi-residual-length", "8", "--json"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const auto j = nlohmann::json::parse(bench.out);
  EXPECT_GT(j.value("prefix_cache_hit_rate", 0.0), 0.3) << bench.out;
}

TEST(CliKvCache, BadTypesAreUsageErrorsNamingTheFlag) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--kv-cache-dtype", "q4_0"},
        std::vector<std::string>{"--kv-cache-dtype-k", "fp4"},
        std::vector<std::string>{"-ctv", "F16"}}) {
    std::vector<std::string> args = {"generate", kStoriesF32,    "--prompt",
                                     "Once",     "--max-tokens", "2"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_vesper(args);
    EXPECT_NE(r.exit_code, 0) << flags[0];
    EXPECT_NE(r.err.find(flags[0] == "-ctv" ? "--kv-cache-dtype-v" : flags[0]), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("fp8_e4m3"), std::string::npos) << "lists the choices: " << r.err;
  }
  auto r = run_vesper({"perplexity", kStoriesF32, "-f", kHeldoutText, "--kv-cache-dtype", "int4"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kv-cache-dtype"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace vesper
