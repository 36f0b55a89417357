// Hugging Face checkpoint directories through the CLI: `generate`, `perplexity` and `inspect`
// take a checkpoint directory wherever they take a GGUF file and give the GGUF conversion's
// results; `vesper convert` writes that conversion (tensors bit-identical to the GGUF of the
// same weights, which llama.cpp's published greedy ids were computed on); bad checkpoints are
// errors that name the file and the fault.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "integration/cli_runner.h"
#include "sanitized.h"

namespace vesper {
namespace {

using testing_util::json_lines;
using testing_util::run_vesper;

const std::string kHfStories = "../shared/models/hf/stories260K";
const std::string kGgufStories = "../shared/models/stories260K.gguf";

std::vector<std::vector<int32_t>> generated_ids(const std::string& model, const std::string& tag) {
  auto r = run_vesper({"generate", model, "--max-tokens", "48", "--temperature", "0", "--json",
                       "--prompt", "Once upon a time", "--prompt", "Lily and Tom went to the park",
                       "--prompt", "Joe loves writing stories"},
                      tag);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::vector<int32_t>> ids;
  for (const auto& line : json_lines(r.out))
    ids.push_back(line["token_ids"].get<std::vector<int32_t>>());
  return ids;
}

TEST(CliHfCheckpoint, GenerateOnTheCheckpointGivesTheGgufsGreedyIds) {
  const auto hf = generated_ids(kHfStories, "hf");
  ASSERT_EQ(hf.size(), 3u);
  EXPECT_EQ(hf, generated_ids(kGgufStories, "gguf"));
  // llama.cpp's published continuation of "Once upon a time" on stories260K.
  const std::vector<int32_t> published = {432, 383, 286, 261, 376, 298, 315, 421,
                                          395, 317, 426, 338, 401, 396, 267, 337};
  EXPECT_EQ(std::vector<int32_t>(hf[0].begin(), hf[0].begin() + 16), published);
}

TEST(CliHfCheckpoint, PerplexityOnTheCheckpointEqualsTheGgufs) {
  auto ppl = [](const std::string& model) {
    auto r = run_vesper({"perplexity", model, "--file", "../shared/data/tinystories-heldout.txt",
                         "--ctx", "128", "--chunks", "4"},
                        "ppl");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto at = r.out.find("PPL = ");
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? std::string() : r.out.substr(at);
  };
  EXPECT_EQ(ppl(kHfStories), ppl(kGgufStories));
}

TEST(CliHfCheckpoint, SynthWritesACheckpointThatRunsAsItsGguf) {
  // The benchmark checkpoints of `vesper synth --format hf` hold the GGUF's weights: the same
  // greedy ids from either.
  const std::string dir = ::testing::TempDir() + "vesper_synth_hf";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<std::string> shape = {
      "synth",       "--n-layer", "2",      "--n-embd", "64",           "--n-head", "4",
      "--n-head-kv", "2",         "--n-ff", "128",      "--vocab-from", kHfStories};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = shape;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_vesper(args, "synth");
  };
  auto gguf = with({"--type", "f16", "-o", dir + "/m.gguf"});
  ASSERT_EQ(gguf.exit_code, 0) << gguf.err;
  auto hf = with({"--type", "f16", "--format", "hf", "-o", dir + "/ckpt"});
  ASSERT_EQ(hf.exit_code, 0) << hf.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt/config.json"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt/.synth.gguf.partial"));
  const auto ids = generated_ids(dir + "/ckpt", "synth_hf");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids, generated_ids(dir + "/m.gguf", "synth_gguf"));

  auto quantized = with({"--format", "hf", "--type", "q4_0", "-o", dir + "/bad"});
  EXPECT_NE(quantized.exit_code, 0);
  EXPECT_NE(quantized.err.find("--type \"q4_0\" is not a checkpoint's"), std::string::npos)
      << quantized.err;
  auto donor = run_vesper({"synth", "--format", "hf", "--type", "f16", "--vocab-from", kGgufStories,
                           "-o", dir + "/bad"},
                          "synth");
  EXPECT_NE(donor.exit_code, 0);
  EXPECT_NE(donor.err.find("--vocab-from must name a directory with a tokenizer.json"),
            std::string::npos)
      << donor.err;
  std::filesystem::remove_all(dir);
}

TEST(CliHfCheckpoint, ConvertWritesTheGgufConversionOfTheWeights) {
  const std::string out = ::testing::TempDir() + "vesper_converted_stories260K.gguf";
  auto c = run_vesper({"convert", kHfStories, "-o", out}, "convert");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  auto converted = gguf::GgufFile::open(out);
  ASSERT_TRUE(converted.ok()) << converted.error().message;
  auto original = gguf::GgufFile::open(kGgufStories);
  ASSERT_TRUE(original.ok());
  ASSERT_EQ(converted->tensors().size(), original->tensors().size());
  for (const auto& want : original->tensors()) {
    const gguf::TensorInfo* got = converted->find_tensor(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->shape, want.shape) << want.name;
    ASSERT_EQ(got->size_bytes, want.size_bytes) << want.name;
    EXPECT_EQ(std::memcmp(got->data, want.data, want.size_bytes), 0) << want.name;
  }
  // The tokenizer as llama.cpp reads it: the same pieces and types, scores that order merges
  // the way the checkpoint's merges do.
  for (const char* key : {"tokenizer.ggml.model", "general.architecture"})
    EXPECT_EQ(*converted->find(key)->as_string(), *original->find(key)->as_string()) << key;
  const auto* tokens = converted->find("tokenizer.ggml.tokens")->as_array();
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->items.size(),
            original->find("tokenizer.ggml.tokens")->as_array()->items.size());
  EXPECT_EQ(generated_ids(out, "converted"), generated_ids(kGgufStories, "gguf2"));

  const std::string q8 = ::testing::TempDir() + "vesper_converted_stories260K_q8_0.gguf";
  auto q = run_vesper({"convert", kHfStories, "-o", q8, "--outtype", "q8_0"}, "convert_q8");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  auto info = run_vesper({"inspect", q8});
  EXPECT_NE(info.out.find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_EQ(generated_ids(q8, "q8").size(), 3u);
  std::remove(out.c_str());
  std::remove(q8.c_str());
}

// llama.cpp ran on the file `vesper convert` writes (bench/llamacpp/make_expected.sh recorded its
// prompt ids and greedy ids, and the file's sha256): today's convert writes the same bytes, and
// Vesper on that file tokenizes and continues each prompt as llama.cpp did.
TEST(CliHfCheckpoint, LlamaCppGivesTheSameIdsOnTheConvertedFile) {
  const auto expected = nlohmann::json::parse(
      testing_util::read_file("bench/llamacpp/expected_stories260K_converted.json"));
  const std::string out = ::testing::TempDir() + "vesper_converted_for_llamacpp.gguf";
  ASSERT_EQ(run_vesper({"convert", kHfStories, "-o", out}).exit_code, 0);
  FILE* sha = ::popen(("sha256sum " + testing_util::shell_quote(out)).c_str(), "r");
  ASSERT_NE(sha, nullptr);
  char digest[65] = {};
  ASSERT_EQ(std::fread(digest, 1, 64, sha), 64u);
  ::pclose(sha);
  EXPECT_EQ(std::string(digest), expected["model_sha256"].get<std::string>());
  int checked = 0;
  for (const auto& r : expected["results"]) {
    auto g = run_vesper({"generate", out, "--prompt", r["prompt"], "--max-tokens", "32",
                         "--temperature", "0", "--ignore-eos", "--json"});
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const auto lines = json_lines(g.out);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0]["prompt_token_ids"], r["prompt_ids"]) << r["prompt"];
    EXPECT_EQ(lines[0]["token_ids"], r["ids"]) << r["prompt"];
    ++checked;
  }
  EXPECT_EQ(checked, 5);
  std::remove(out.c_str());
}

// Perplexity on held-out text; `kl` adds --kl-divergence-base and its arguments. `report` gets
// the output.
double perplexity_of(const std::string& model, std::vector<std::string> kl = {},
                     std::string* report = nullptr) {
  std::vector<std::string> args = {"perplexity",
                                   model,
                                   "--file",
                                   "../shared/data/tinystories-heldout.txt",
                                   "--ctx",
                                   "128",
                                   "--chunks",
                                   "40",
                                   "--kv-cache-dtype",
                                   "f32"};
  args.insert(args.end(), kl.begin(), kl.end());
  auto r = run_vesper(args, "exl2_ppl");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (report != nullptr) *report = r.out;
  const auto at = r.out.find("PPL = ");
  return at == std::string::npos ? 0.0 : std::stod(r.out.substr(at + 6));
}

// The second half of the held-out text (from byte 73,000), as calibration text: the perplexity
// runs read its first 5,120 tokens (~13 KB), so calibration and evaluation do not overlap.
std::string calibration_text() {
  const std::string path = ::testing::TempDir() + "vesper_exl2_calibration.txt";
  std::ifstream in("../shared/data/tinystories-heldout.txt", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(path, std::ios::binary) << text.substr(73000);
  return path;
}

// The 12 prompts of the greedy comparisons.
const std::vector<std::string> kStoryPrompts = {"Once upon a time",
                                                "Lily and Tom went to the park",
                                                "Joe loves writing stories",
                                                "The little dog",
                                                "One day, a cat named Tom",
                                                "Hi how are you",
                                                "I believe the meaning of life is",
                                                "The sun was hot and",
                                                "Mom said",
                                                "A big red ball",
                                                "Ben wanted to help",
                                                "They saw a bird"};

// Greedy generation of 32 tokens for each of kStoryPrompts: {prompt_token_ids, token_ids} per
// prompt.
std::vector<nlohmann::json> greedy_stories(const std::string& model) {
  std::vector<std::string> args = {"generate",      model, "--max-tokens", "32",
                                   "--temperature", "0",   "--json"};
  for (const std::string& p : kStoryPrompts) {
    args.push_back("--prompt");
    args.push_back(p);
  }
  auto r = run_vesper(args, "exl2_gen");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json_lines(r.out);
}

// `vesper quantize DIR --to exl2` at 4.0, 6.0 and 8.0 bits per weight (4.0 and 8.0 calibrated on
// 32 chunks of 128 tokens of text, 6.0 by weight error): each directory loads and runs (the EXL2
// layers repacked into exact integer parts), with perplexity on held-out text at ctx 128 within
// 1% of f32 at 6.0 and 8.0 and below 1.5x at 4.0 (measured: +11.4%, +0.67%, +0.34% over these 40
// chunks). 8.0's greedy ids against f32's on 12 prompts, 32 tokens each, every token chosen
// after the same context (f32's prompt and output so far, given as prompt_token_ids): 377 of 384
// equal (98%; the issue asks 90%). Printed, not checked: free-running generation, where one early
// flip changes every later token and stories260K's top-2 margins are tiny: 293 of 384 (the same
// prompts give 311 with GGUF q8_0 weights and 377 with f16 ones); and next-token agreement on the
// held-out text (`perplexity --kl-divergence`, checked >= 90%): 96.8% of 2,520 tokens.
// Under a sanitizer (VESPER_SANITIZED) only 4.0 runs: that checks memory.
TEST(CliHfCheckpoint, Exl2QuantizedCheckpointsRunNearF32) {
  const std::string base = ::testing::TempDir() + "vesper_exl2_f32.kl";
  const double f32 = perplexity_of(kHfStories, {"--kl-divergence-base", base});
  ASSERT_GT(f32, 2.0);
  const std::string calibration = calibration_text();
  const bool sanitized = testing_util::sanitized();
  std::map<std::string, double> ppl;
  for (const std::string bits : {"4.0", "6.0", "8.0"}) {
    if (sanitized && bits != "4.0") continue;
    const std::string dir = ::testing::TempDir() + "vesper_exl2_" + bits;
    std::filesystem::remove_all(dir);
    std::vector<std::string> args = {"quantize", kHfStories, "--to", "exl2",
                                     "--bits",   bits,       "-o",   dir};
    const bool calibrated = bits != "6.0";
    if (calibrated) {
      for (const char* a : {"--calibration-chunks", "32", "--calibration"}) args.push_back(a);
      args.push_back(calibration);
    }
    auto q = run_vesper(args, "exl2_q");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_NE(q.err.find("EXL2, 31 layers quantized"), std::string::npos) << q.err;
    std::ifstream config_in(dir + "/config.json");
    const auto config = nlohmann::json::parse(config_in);
    EXPECT_EQ(config["quantization_config"]["calibration"].contains("text"), calibrated)
        << config.dump();
    if (calibrated) {
      EXPECT_NE(
          q.err.find("calibration: vesper_exl2_calibration.txt: 4096 tokens in chunks of 128"),
          std::string::npos)
          << q.err;
    }
    std::string report;
    ppl[bits] = perplexity_of(dir, {"--kl-divergence-base", base, "--kl-divergence"}, &report);
    const auto same_top = report.find("Same top token: ");
    ASSERT_NE(same_top, std::string::npos) << report;
    const double agreement = std::stod(report.substr(same_top + 16));
    std::printf("  EXL2 %s bpw: same top token as f32 on %.2f%% of the text\n", bits.c_str(),
                agreement);
    std::printf("  EXL2 %s bpw: PPL %.4f (f32 %.4f, %+.2f%%)\n", bits.c_str(), ppl[bits], f32,
                100 * (ppl[bits] / f32 - 1));
    if (bits == "8.0") {
      EXPECT_GE(agreement, 90.0);
      const auto want = greedy_stories(kHfStories);
      ASSERT_EQ(want.size(), 12u);
      // Each of f32's tokens, asked of 8.0 after f32's own context.
      const std::string prompts = ::testing::TempDir() + "vesper_exl2_forced.jsonl";
      {
        std::ofstream out(prompts);
        for (const auto& r : want) {
          auto context = r["prompt_token_ids"].get<std::vector<int32_t>>();
          for (int32_t t : r["token_ids"].get<std::vector<int32_t>>()) {
            out << nlohmann::json{{"prompt_token_ids", context}, {"max_tokens", 1}}.dump() << "\n";
            context.push_back(t);
          }
        }
      }
      auto forced = run_vesper(
          {"generate", dir, "--prompts-file", prompts, "--temperature", "0", "--json"}, "forced");
      ASSERT_EQ(forced.exit_code, 0) << forced.err;
      const auto got = json_lines(forced.out);
      int same = 0, total = 0;
      for (const auto& r : want)
        for (int32_t t : r["token_ids"].get<std::vector<int32_t>>()) {
          const auto& g = got.at(static_cast<size_t>(total++));
          same += g["token_ids"].at(0).get<int32_t>() == t;
        }
      std::printf("  EXL2 8.0 bpw: %d of %d of f32's greedy tokens chosen after f32's context\n",
                  same, total);
      EXPECT_EQ(total, 384);
      EXPECT_GE(same * 10, total * 9);
      const auto free_running = greedy_stories(dir);
      ASSERT_EQ(free_running.size(), 12u);
      int free_same = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const auto a = free_running[i]["token_ids"].get<std::vector<int32_t>>();
        const auto b = want[i]["token_ids"].get<std::vector<int32_t>>();
        for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) free_same += a[t] == b[t];
      }
      std::printf("  EXL2 8.0 bpw: free-running, %d of %d greedy tokens equal f32's\n", free_same,
                  total);
      std::remove(prompts.c_str());
    }
    std::filesystem::remove_all(dir);
  }
  EXPECT_LT(ppl["4.0"] / f32, 1.5);
  std::remove(calibration.c_str());
  if (sanitized) return;
  EXPECT_LT(ppl["8.0"] / f32 - 1, 0.01);
  EXPECT_LT(ppl["6.0"] / f32 - 1, 0.01);
  EXPECT_GT(ppl["4.0"], ppl["6.0"]);
  std::remove(base.c_str());
}

TEST(CliHfCheckpoint, Exl2QuantizeWritesTheSameFileOnAnyThreadCount) {
  // Layers are measured and quantized in parallel, each on one thread.
  std::string bytes[2];
  for (int threads : {1, 2}) {
    const std::string dir = ::testing::TempDir() + "vesper_exl2_t" + std::to_string(threads);
    std::filesystem::remove_all(dir);
    auto q = run_vesper({"quantize", kHfStories, "--to", "exl2", "--bits", "3.5", "-t",
                         std::to_string(threads), "-o", dir},
                        "exl2_threads");
    ASSERT_EQ(q.exit_code, 0) << q.err;
    std::ifstream in(dir + "/model.safetensors", std::ios::binary);
    bytes[threads - 1].assign(std::istreambuf_iterator<char>(in), {});
    std::filesystem::remove_all(dir);
  }
  EXPECT_GT(bytes[0].size(), 100000u);
  EXPECT_TRUE(bytes[0] == bytes[1]);
}

TEST(CliHfCheckpoint, Exl2FlagsAreCheckedNamingTheFlag) {
  auto gguf =
      run_vesper({"quantize", kGgufStories, "--to", "exl2", "-o", "/tmp/vesper_exl2_from_gguf"});
  EXPECT_NE(gguf.exit_code, 0);
  EXPECT_NE(gguf.err.find("--to exl2 reads a Hugging Face checkpoint directory"), std::string::npos)
      << gguf.err;
  auto bits = run_vesper(
      {"quantize", kHfStories, "--to", "exl2", "--bits", "9", "-o", "/tmp/vesper_exl2_bad"});
  EXPECT_NE(bits.exit_code, 0);
  EXPECT_NE(bits.err.find("--bits 9"), std::string::npos) << bits.err;
  auto no_text = run_vesper({"quantize", kHfStories, "--to", "exl2", "--calibration",
                             "/nonexistent/cal.txt", "-o", "/tmp/vesper_exl2_bad"});
  EXPECT_NE(no_text.exit_code, 0);
  EXPECT_NE(no_text.err.find("--calibration /nonexistent/cal.txt: cannot open"), std::string::npos)
      << no_text.err;
  const std::string tiny = ::testing::TempDir() + "vesper_tiny_calibration.txt";
  std::ofstream(tiny) << "Once upon a time, there was a cat.";
  auto short_text = run_vesper({"quantize", kHfStories, "--to", "exl2", "--calibration", tiny, "-o",
                                "/tmp/vesper_exl2_bad"});
  EXPECT_NE(short_text.exit_code, 0);
  EXPECT_NE(short_text.err.find("fewer than one chunk of --calibration-ctx 128"), std::string::npos)
      << short_text.err;
  std::remove(tiny.c_str());
  auto long_ctx = run_vesper({"quantize", kHfStories, "--to", "exl2", "--calibration",
                              "../shared/data/tinystories-heldout.txt", "--calibration-ctx", "4096",
                              "-o", "/tmp/vesper_exl2_bad"});
  EXPECT_NE(long_ctx.exit_code, 0);
  EXPECT_NE(long_ctx.err.find("--calibration-ctx 4096 exceeds the model's context length 128"),
            std::string::npos)
      << long_ctx.err;
  auto ctx_alone = run_vesper({"quantize", kHfStories, "--to", "exl2", "--calibration-chunks", "4",
                               "-o", "/tmp/vesper_exl2_bad"});
  EXPECT_NE(ctx_alone.exit_code, 0);
  EXPECT_NE(ctx_alone.err.find("--calibration-ctx and --calibration-chunks need --calibration"),
            std::string::npos)
      << ctx_alone.err;
  auto gguf_cal = run_vesper({"quantize", kGgufStories, "--type", "q8_0", "--calibration",
                              "../shared/models/README.md", "-o", "/tmp/vesper_cal.gguf"});
  EXPECT_NE(gguf_cal.exit_code, 0);
  EXPECT_NE(gguf_cal.err.find("--calibration applies to --to exl2 only"), std::string::npos)
      << gguf_cal.err;
  auto to = run_vesper({"quantize", kHfStories, "--to", "gptq", "-o", "/tmp/vesper_exl2_bad"});
  EXPECT_NE(to.err.find("--to \"gptq\" is not supported"), std::string::npos) << to.err;
}

TEST(CliHfCheckpoint, InspectShowsTheAssembledFile) {
  auto r = run_vesper({"inspect", kHfStories});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizer.ggml.model"), std::string::npos) << r.out;
}

TEST(CliHfCheckpoint, ErrorsNameTheCheckpointAndTheFault) {
  // Weights without a tokenizer: the model loads, text needs a tokenizer.
  auto no_tok =
      run_vesper({"generate", "../shared/models/hf/tiny-random-llama3", "--prompt", "hi"});
  EXPECT_NE(no_tok.exit_code, 0);
  EXPECT_NE(no_tok.err.find("tiny-random-llama3"), std::string::npos) << no_tok.err;
  EXPECT_NE(no_tok.err.find("no tokenizer: the checkpoint has no tokenizer.json"),
            std::string::npos)
      << no_tok.err;

  const std::string empty = ::testing::TempDir() + "vesper_empty_checkpoint";
  std::filesystem::create_directories(empty);
  auto r = run_vesper({"generate", empty, "--prompt", "hi"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("a directory without config.json"), std::string::npos) << r.err;
  auto c = run_vesper({"convert", kHfStories, "-o", "/tmp/x.gguf", "--outtype", "q9_9"});
  EXPECT_NE(c.exit_code, 0);
  EXPECT_NE(c.err.find("--type \"q9_9\" is not supported"), std::string::npos) << c.err;
  std::filesystem::remove_all(empty);
}

}  // namespace
}  // namespace vesper
