// Adapters through the command line on stories260K: `vesper generate` mixes adapters in one
// offline batch by each prompt's "model" field (each prompt gets what it gets alone), takes
// llama.cpp's --lora / --lora-scaled, runs a random adapter `vesper synth --base` writes, and
// names the flag, file or prompt at fault in every error.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace vesper {
namespace {

using testing_util::kStories;

using testing_util::json_lines;
using testing_util::run_vesper;
const std::string kZed = "../shared/models/lora/zed/adapter.gguf";
const std::string kBim = "../shared/models/lora/bim";

std::string write_prompts(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = ::testing::TempDir() + "vesper_lora_" + name + ".jsonl";
  std::ofstream f(path);
  for (const auto& l : lines) f << l << "\n";
  return path;
}

TEST(CliLora, GenerateMixesAdaptersByEachPromptsModel) {
  const std::string prompts = write_prompts(
      "mixed", {R"({"prompt": "One day, a little girl named", "model": "zed"})",
                R"({"prompt": "One day, a little girl named", "model": "bim"})",
                R"({"prompt": "One day, a little girl named", "model": "stories260K"})",
                R"({"prompt": "One day, a little girl named"})"});
  const std::vector<std::string> common = {
      "generate",    kStories,      "--enable-lora", "--max-loras", "2",  "--lora-modules",
      "zed=" + kZed, "bim=" + kBim, "--temperature", "0",           "-n", "12",
      "--json"};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--prompts-file", prompts});
  const auto r = run_vesper(args, "mixed");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto out = json_lines(r.out);
  ASSERT_EQ(out.size(), 4u) << r.out;
  EXPECT_EQ(out[0]["text"].get<std::string>().rfind(" Zed", 0), 0u) << out[0]["text"];
  EXPECT_EQ(out[1]["text"].get<std::string>().rfind(" Bim", 0), 0u) << out[1]["text"];
  EXPECT_EQ(out[2]["text"].get<std::string>().rfind(" Lily", 0), 0u) << out[2]["text"];
  EXPECT_EQ(out[3]["text"], out[2]["text"]);
  // Each alone gives the same.
  for (const std::string model : {"zed", "bim"}) {
    const std::string one =
        write_prompts("one_" + model,
                      {R"({"prompt": "One day, a little girl named", "model": ")" + model + "\"}"});
    std::vector<std::string> a = common;
    a.insert(a.end(), {"--prompts-file", one});
    const auto alone = run_vesper(a, "one");
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(json_lines(alone.out).at(0)["token_ids"], out[model == "zed" ? 0 : 1]["token_ids"]);
  }
}

TEST(CliLora, MergedAdaptersAndSyntheticOnes) {
  const auto zed = run_vesper({"generate", kStories, "--lora", kZed, "--prompt",
                               "One day, a little girl named", "--temperature", "0", "-n", "4"},
                              "merged");
  ASSERT_EQ(zed.exit_code, 0) << zed.err;
  EXPECT_NE(zed.out.find("Zed"), std::string::npos) << zed.out;
  EXPECT_NE(zed.err.find("merged into every request at scale 1"), std::string::npos) << zed.err;

  // Random adapters in every tensor type an adapter file may hold; f16 ones stay f16 in memory.
  for (const std::string type : {"f16", "f32", "bf16", "q8_0"}) {
    const std::string synth = ::testing::TempDir() + "vesper_synth_lora_" + type + ".gguf";
    const auto w = run_vesper({"synth", "--base", kStories, "--lora-rank", "4", "--lora-targets",
                               "q,v,down", "--type", type, "-o", synth},
                              "synth");
    ASSERT_EQ(w.exit_code, 0) << w.err;
    const auto g = run_vesper({"generate", kStories, "--lora-scaled", synth, "0.25", "--prompt",
                               "Once upon a time", "-n", "4"},
                              "synth_run");
    ASSERT_EQ(g.exit_code, 0) << type << ": " << g.err;
    EXPECT_NE(g.err.find("rank 4"), std::string::npos) << g.err;
  }
  const auto bad_type = run_vesper(
      {"synth", "--base", kStories, "--lora-rank", "4", "--type", "q4_0", "-o", "/dev/null"}, "q4");
  EXPECT_NE(bad_type.exit_code, 0);
  EXPECT_NE(bad_type.err.find("f32, f16, bf16 or q8_0"), std::string::npos) << bad_type.err;
}

TEST(CliLora, BadFlagsFilesAndNamesAreErrorsNamingThem) {
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> words;
  };
  const std::string unknown = write_prompts("unknown", {R"({"prompt": "Hi", "model": "nope"})"});
  const std::vector<Case> cases = {
      {{"--lora-modules", "zed=" + kZed}, {"--lora-modules needs --enable-lora"}},
      {{"--enable-lora", "--lora-modules", "zed"}, {"--lora-modules zed", "name=path"}},
      {{"--enable-lora", "--lora-modules", "zed=" + kZed, "zed=" + kBim}, {"'zed'", "twice"}},
      {{"--enable-lora", "--lora-modules", R"({"name": "z", "path": 3})"}, {"\"path\""}},
      {{"--enable-lora", "--lora-modules", "z=no/such/dir"}, {"--lora-modules z", "no/such/dir"}},
      {{"--lora-scaled", kZed, "half"}, {"--lora-scaled", "half"}},
      {{"--lora", kStories}, {"--lora", "stories260K.gguf", "not a LoRA adapter"}},
      {{"--enable-lora", "--lora-modules", "v=../shared/models/vera/zed"},
       {"--lora-modules v", "rank 32", "--max-lora-rank 16"}},
      {{"--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"},
       {"--max-cpu-loras 2", "--max-loras 4"}},
      {{"--enable-lora", "--prompts-file", unknown}, {"prompt 1", "no adapter named 'nope'"}},
      {{"--prompts-file", unknown}, {"prompt 1", "--enable-lora"}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"generate", kStories, "--prompt", "Hi", "-n", "2"};
    if (std::find(c.args.begin(), c.args.end(), "--prompts-file") != c.args.end())
      args = {"generate", kStories, "-n", "2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const auto r = run_vesper(args, "bad");
    EXPECT_NE(r.exit_code, 0) << c.args[0];
    EXPECT_EQ(r.exit_code < 128, true) << "crashed: " << r.err;
    for (const std::string& w : c.words)
      EXPECT_NE(r.err.find(w), std::string::npos) << "\"" << w << "\" not in: " << r.err;
  }
}

}  // namespace
}  // namespace vesper
