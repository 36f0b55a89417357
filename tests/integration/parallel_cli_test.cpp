// Tensor and pipeline parallelism through the `vesper` command line under Open MPI's mpirun (2
// ranks, 1 thread each; both splits at once, and 4 pipeline stages, on 4): token ids and
// log-probabilities equal one
// process's, bit for bit, on 64 prompts of 48 tokens for stories260K (f16, fp8 and KIVI KV caches)
// and a 512-wide model in q4_0, q8_0, q4_K, q6_K and f16 and an EXL2 checkpoint, under each split;
// the same run to run; chunked prefill, preemption by recompute and swap, prefix caching off,
// multi-step and speculative decoding (n-gram, draft model, Medusa) under either split, pipelines
// keeping a plan in flight a stage where they can (virtual engines) and one where not; LoRA and
// VeRA adapters under each split; perplexity; and the launch, shape and split errors, each naming
// the flag or hyper-parameter. Skipped where vesper was built without Open MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "sanitized.h"

namespace vesper {
namespace {

using testing_util::kStoriesF32;
using testing_util::with;

using testing_util::CommandResult;
using testing_util::json_lines;
using testing_util::run_vesper;
using testing_util::shell_quote;

const std::string kDraft = "../shared/models/stories-draft.gguf";

#ifdef VESPER_MPIEXEC
constexpr bool kHaveMpi = true;
const char* const kMpiexec = VESPER_MPIEXEC;
#else
constexpr bool kHaveMpi = false;
const char* const kMpiexec = "";
#endif

// `vesper args` as `ranks` processes of one mpirun job (as root where the tests run as root; more
// ranks than cores allowed), ended after 180 s if it hangs.
CommandResult run_mpi(int ranks, const std::vector<std::string>& args, const std::string& tag) {
  return testing_util::run_vesper_with(
      "timeout 180 " + shell_quote(kMpiexec) +
          " --allow-run-as-root --oversubscribe --bind-to none"
          // Containers often forbid the cross-process reads (CMA) Open MPI's shared-memory
          // transport uses for large messages; plain copies always work.
          " --mca btl_vader_single_copy_mechanism none -n " +
          std::to_string(ranks),
      args, "mpi_" + tag);
}

std::filesystem::path work_dir() {
  static const std::filesystem::path dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("vesper_tp_models_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// stories260K widened to 512 (8 heads of 64, 4 KV heads, n_ff 1024) in `type`: the same function
// as stories260K (vesper synth --widen-from), with shapes every type splits in two on block
// boundaries (o: 256 inputs a rank, down: 512).
std::string wide_model(const std::string& type) {
  const std::string path = (work_dir() / ("wide-" + type + ".gguf")).string();
  if (!std::filesystem::exists(path)) {
    auto r = run_vesper({"synth", "--widen-from", kStoriesF32, "--n-embd", "512", "--n-head", "8",
                         "--n-head-kv", "4", "--n-ff", "1024", "--type", type, "-o", path},
                        "synth");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  return path;
}

// stories260K's Hugging Face checkpoint quantized to EXL2 at 4.0 bits per weight (layers of
// composite weights: 2-8-bit parts, act order).
std::string exl2_model() {
  const std::string dir = (work_dir() / "exl2-4.0").string();
  if (!std::filesystem::exists(dir)) {
    auto r = run_vesper(
        {"quantize", "../shared/models/hf/stories260K", "--to", "exl2", "--bits", "4.0", "-o", dir},
        "exl2");
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  return dir;
}

// 64 prompts of 48 tokens each from the held-out text (token ids, so every model reads the same
// 48), greedy, 16 tokens each, with the top 2 log-probabilities.
std::string prompts_file() {
  static const std::string path = [] {
    std::ifstream text("../shared/data/tinystories-heldout.txt");
    std::vector<std::string> words;
    for (std::string w; text >> w && words.size() < 64 * 200;) words.push_back(w);
    const std::string texts = (work_dir() / "texts.txt").string();
    {
      std::ofstream out(texts);
      for (size_t p = 0; p < 64; ++p) {
        std::string line;
        for (size_t i = 0; i < 40; ++i) line += (i ? " " : "") + words[p * 200 + i];
        out << line << "\n";
      }
    }
    auto r = run_vesper({"generate", kStoriesF32, "--prompts-file", texts, "-n", "1", "--json"},
                        "tokens");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string file = (work_dir() / "prompts.jsonl").string();
    std::ofstream out(file);
    for (const auto& j : json_lines(r.out)) {
      std::vector<int32_t> ids = j["prompt_token_ids"].get<std::vector<int32_t>>();
      EXPECT_GE(ids.size(), 48u);
      ids.resize(48);
      out << nlohmann::json{{"prompt_token_ids", ids},
                            {"max_tokens", 16},
                            {"temperature", 0},
                            {"ignore_eos", true},
                            {"logprobs", 2}}
                 .dump()
          << "\n";
    }
    return file;
  }();
  return path;
}

std::vector<std::string> generate(const std::string& model, std::vector<std::string> extra = {}) {
  return with({"generate", model, "--prompts-file", prompts_file(), "--json", "-t", "1"}, extra);
}

// Tensor parallelism computes every output element whole on one rank (model.h), so its token ids
// and log-probabilities are one process's, bit for bit.
void expect_same_outputs(const CommandResult& one, const CommandResult& tp,
                         const std::string& what) {
  ASSERT_EQ(one.exit_code, 0) << what << ": " << one.err;
  ASSERT_EQ(tp.exit_code, 0) << what << ": " << tp.err;
  const auto a = json_lines(one.out), b = json_lines(tp.out);
  ASSERT_EQ(a.size(), 64u) << what;
  ASSERT_EQ(b.size(), 64u) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["token_ids"], b[i]["token_ids"]) << what << ", prompt " << i;
    EXPECT_EQ(a[i]["logprobs"], b[i]["logprobs"]) << what << ", prompt " << i;
  }
}

class ParallelCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kHaveMpi) GTEST_SKIP() << "vesper was built without Open MPI";
    // Open MPI's own allocations and shared-memory transport are reported by LeakSanitizer and
    // ThreadSanitizer as if they were vesper's; the release run covers these paths.
    if (testing_util::sanitized()) GTEST_SKIP() << "mpirun jobs do not run under sanitizers";
  }
};

// The splits: tensor parallelism (every layer over 2 ranks), pipeline parallelism (2 stages of
// layers) and both (2 stages of 2 ranks: 4 ranks on 2 cores, so fewer cases).
struct Split {
  int ranks;
  std::vector<std::string> flags;
  std::string name() const {
    std::string n;
    for (const auto& f : flags) n += " " + f;
    return n;
  }
};
const std::vector<Split> kSplits = {{2, {"-tp", "2"}}, {2, {"-pp", "2"}}};
const Split kBoth = {4, {"-tp", "2", "-pp", "2"}};
// stories260K's 5 layers in 4 stages (2, 1, 1, 1): a plan in flight a stage.
const Split kFourStages = {4, {"-pp", "4"}};

TEST_F(ParallelCli, OutputsEqualOneProcessAcrossWeightAndKvTypes) {
  struct Case {
    std::string model, what;
    std::vector<std::string> flags;
  };
  std::vector<Case> cases = {
      {kStoriesF32, "stories260K f32", {}},
      {kStoriesF32, "stories260K f32, fp8 KV", {"--kv-cache-dtype", "fp8"}},
      {kStoriesF32, "stories260K f32, kivi2 KV", {"--kv-cache-dtype", "kivi2"}}};
  for (const std::string type : {"q4_0", "q8_0", "q4_K", "q6_K", "f16"})
    cases.push_back({wide_model(type), "wide " + type, {}});
  cases.push_back({exl2_model(), "stories260K EXL2 4.0", {}});
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const auto one = run_vesper(generate(c.model, c.flags), "one");
    // Every case under tensor parallelism, which cuts each weight type's matrices; pipeline
    // stages run every op as one process does, so a few weight types suffice there.
    std::vector<Split> splits = {kSplits[0]};
    const bool pipeline = c.model == kStoriesF32 || c.what == "wide q4_K" || c.what == "wide f16";
    if (pipeline) splits.push_back(kSplits[1]);
    if (i == 0 || i == 2 || c.what == "wide q4_K") splits.push_back(kBoth);
    if (i == 0) splits.push_back(kFourStages);
    for (const Split& split : splits) {
      const auto run = run_mpi(split.ranks, generate(c.model, with(c.flags, split.flags)), "split");
      expect_same_outputs(one, run, c.what + split.name());
      if (split.flags == kFourStages.flags) {
        EXPECT_NE(run.err.find("4 plans in flight on disjoint sequences"), std::string::npos)
            << run.err;
      }
    }
  }
}

TEST_F(ParallelCli, OutputIsIdenticalRunToRun) {
  const std::string model = wide_model("q4_0");
  const auto first = run_mpi(2, generate(model, {"-tp", "2"}), "tp1");
  const auto second = run_mpi(2, generate(model, {"-tp", "2"}), "tp2");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(json_lines(first.out).size(), 64u);
  EXPECT_EQ(first.out, second.out);  // token ids and log-probabilities, bit for bit
  EXPECT_NE(first.err.find("tensor parallel: 2 ranks"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("memory plan per rank (each from its own memory; the job runs the "
                           "fewest): rank 0: "),
            std::string::npos)
      << first.err;
}

TEST_F(ParallelCli, EngineFeaturesUnderEitherSplit) {
  const auto one = run_vesper(generate(kStoriesF32), "one");
  struct Case {
    std::string name;
    std::vector<std::string> flags;
  };
  // Features that do not interfere share a run (each run is a job launch).
  const std::vector<Case> cases = {
      {"chunked prefill, preemption by swap",
       {"--max-num-batched-tokens", "40", "--num-gpu-blocks-override", "12", "--max-num-seqs", "8",
        "--preemption-mode", "swap"}},
      {"preemption by recompute, no prefix caching",
       {"--num-gpu-blocks-override", "12", "--max-num-seqs", "8", "--no-enable-prefix-caching"}},
      {"multi-step", {"--num-scheduler-steps", "4"}},
      {"n-gram speculation", {"--speculative-model", "[ngram]", "--num-speculative-tokens", "3"}},
      {"draft model", {"--speculative-model", kDraft, "--num-speculative-tokens", "3"}},
      {"Medusa heads",
       {"--speculative-model", "../shared/models/medusa", "--num-speculative-tokens", "3"}},
  };
  for (const Split& split : kSplits)
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const auto run =
          run_mpi(split.ranks, generate(kStoriesF32, with(c.flags, split.flags)), "split");
      expect_same_outputs(one, run, c.name + split.name());
      // A pipeline keeps two plans in flight (virtual engines) unless a plan has several passes
      // or proposals.
      if (split.flags[0] == "-pp") {
        EXPECT_NE(
            run.err.find(i < 2 ? "2 plans in flight on disjoint sequences" : "1 plan in flight"),
            std::string::npos)
            << c.name << ": " << run.err;
      }
    }
  for (const size_t i : {0, 4})  // chunked prefill and swap, draft model
    expect_same_outputs(
        one, run_mpi(kBoth.ranks, generate(kStoriesF32, with(cases[i].flags, kBoth.flags)), "both"),
        cases[i].name + kBoth.name());
}

// LoRA (llama.cpp GGUF and PEFT) and VeRA adapters: the leader sends each slot's modules to the
// other ranks when the slot is loaded; every rank applies its output rows or its layers.
TEST_F(ParallelCli, AdaptersUnderEachSplit) {
  const std::string m = "../shared/models/";
  std::ifstream text("../shared/data/tinystories-heldout.txt");
  std::vector<std::string> words;
  for (std::string w; text >> w && words.size() < 64 * 100;) words.push_back(w);
  const std::string file = (work_dir() / "adapters.jsonl").string();
  {
    std::ofstream out(file);
    const char* names[] = {"zed", "bim", "vz", "stories260K"};
    for (size_t i = 0; i < 64; ++i) {
      std::string prompt;
      for (size_t k = 0; k < 12; ++k) prompt += (k ? " " : "") + words[i * 100 + k];
      out << nlohmann::json{{"prompt", prompt}, {"model", names[i % 4]}, {"max_tokens", 16},
                            {"temperature", 0}, {"ignore_eos", true},    {"logprobs", 2}}
                 .dump()
          << "\n";
    }
  }
  const std::vector<std::string> args = {"generate",
                                         m + "stories260K.gguf",
                                         "--enable-lora",
                                         "--max-loras",
                                         "2",
                                         "--max-lora-rank",
                                         "64",
                                         "--lora-modules",
                                         "zed=" + m + "lora/zed/adapter.gguf",
                                         "bim=" + m + "lora/bim",
                                         "vz=" + m + "vera/zed",
                                         "--prompts-file",
                                         file,
                                         "--json",
                                         "-t",
                                         "1"};
  const auto one = run_vesper(args, "one");
  std::vector<Split> splits = kSplits;
  splits.push_back(kBoth);
  for (const Split& split : splits)
    expect_same_outputs(one, run_mpi(split.ranks, with(args, split.flags), "split"),
                        "adapters" + split.name());
}

TEST_F(ParallelCli, PerplexityEqualsOneProcess) {
  const std::vector<std::string> args = {
      "perplexity", kStoriesF32, "-f",       "../shared/data/tinystories-heldout.txt",
      "--ctx",      "128",       "--chunks", "8",
      "-t",         "1"};
  const auto one = run_vesper(args, "ppl1");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto final_ppl = [](const std::string& s) {
    const size_t at = s.find("PPL = ");
    return at == std::string::npos ? -1.0 : std::stod(s.substr(at + 6));
  };
  const double a = final_ppl(one.out + one.err);
  ASSERT_GT(a, 1.0) << one.out << one.err;
  std::vector<Split> splits = kSplits;
  splits.push_back(kBoth);
  for (const Split& split : splits) {
    const auto r = run_mpi(split.ranks, with(args, split.flags), "ppl2");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(final_ppl(r.out + r.err), a) << split.name() << "\n" << r.out << r.err;
  }
}

TEST_F(ParallelCli, LaunchAndShapeErrorsNameTheFlagOrTensor) {
  auto expect_error = [](const CommandResult& r, const std::string& text) {
    EXPECT_NE(r.exit_code, 0) << text;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  };
  expect_error(run_vesper(generate(kStoriesF32, {"-tp", "2"}), "nompi"), "mpirun -n 2");
  expect_error(run_mpi(2, generate(kStoriesF32), "notp"), "pass --tensor-parallel-size 2");
  expect_error(run_mpi(3, generate(kStoriesF32, {"-tp", "3"}), "tp3"),
               "attention heads (8) do not split into 3 equal parts");
  expect_error(run_mpi(2, generate(kStoriesF32, {"-tp", "2", "-pp", "2"}), "tppp"),
               "mpirun started 2 processes, and the parallel sizes ask for 4");
  expect_error(
      run_mpi(2, generate(kStoriesF32, {"-pp", "2", "--pipeline-layer-split", "4,4"}), "split"),
      "--pipeline-layer-split gives 2 stages of 8 layers in all; the model has 5 layers");
  expect_error(
      run_mpi(2, generate(kStoriesF32, {"-pp", "2", "--pipeline-layer-split", "5,0"}), "empty"),
      "every stage needs a layer");
  expect_error(run_vesper(generate(kStoriesF32, {"--pipeline-layer-split", "3,2"}), "nopp"),
               "--pipeline-layer-split needs --pipeline-parallel-size above 1");
  // One KV head cannot be split in two.
  const std::string mqa = (work_dir() / "mqa.gguf").string();
  ASSERT_EQ(
      run_vesper({"synth", "--n-head", "4", "--n-head-kv", "1", "-o", mqa}, "synth").exit_code, 0);
  expect_error(run_mpi(2, generate(mqa, {"-tp", "2"}), "mqa"),
               "KV heads (1) do not split into 2 equal parts");
}

}  // namespace
}  // namespace vesper
