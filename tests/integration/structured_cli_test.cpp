// Structured output through `vesper generate` (llama.cpp's --grammar / --json-schema flags) on
// stories260K: every output is in the language, greedy ids do not depend on batching, chunked
// prefill or speculative decoding (proposals outside the grammar are rejected), and bad
// grammars and schemas are errors naming the flag and what is wrong.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli_runner.h"

namespace vesper {
namespace {

using testing_util::kStoriesF32;

using testing_util::json_lines;
using testing_util::run_vesper;
const std::string kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 16},
  "age": {"type": "integer", "minimum": 1, "maximum": 120},
  "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
  "happy": {"type": "boolean"}},
  "required": ["name", "age", "pets", "happy"], "additionalProperties": false})";
const std::vector<std::string> kPrompts = {"Once upon a time", "Tom and Lily went to the park.",
                                           "The little dog", "One day, a girl named Sue"};

std::vector<std::string> generate_args(const std::vector<std::string>& prompts,
                                       std::vector<std::string> extra) {
  std::vector<std::string> a = {"generate", kStoriesF32, "--max-tokens", "200", "--json",
                                "-t",       "2"};
  for (const std::string& p : prompts) {
    a.push_back("--prompt");
    a.push_back(p);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

void expect_valid_person(const nlohmann::json& r) {
  ASSERT_EQ(r["finish_reason"], "stop") << r.dump();
  const nlohmann::json j = nlohmann::json::parse(r["text"].get<std::string>(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r["text"];
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 4u) << j.dump();
  ASSERT_TRUE(j["name"].is_string());
  EXPECT_LE(j["name"].get<std::string>().size(), 16u * 4);  // 16 characters of UTF-8 at most
  ASSERT_TRUE(j["age"].is_number_integer());
  EXPECT_GE(j["age"].get<int>(), 1);
  EXPECT_LE(j["age"].get<int>(), 120);
  ASSERT_TRUE(j["pets"].is_array());
  EXPECT_LE(j["pets"].size(), 3u);
  for (const auto& p : j["pets"]) EXPECT_TRUE(p == "cat" || p == "dog" || p == "fish") << p;
  EXPECT_TRUE(j["happy"].is_boolean());
}

TEST(CliStructured, JsonSchemaOutputsValidateForEverySeed) {
  for (int seed = 1; seed <= 6; ++seed) {
    auto r = run_vesper(generate_args(kPrompts, {"--json-schema", kSchema, "--temperature", "1",
                                                 "--seed", std::to_string(seed)}),
                        "schema");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), kPrompts.size());
    for (const auto& l : lines) expect_valid_person(l);
  }
}

TEST(CliStructured, GreedyIdsDoNotDependOnBatchingChunkingOrSpeculation) {
  const std::vector<std::string> greedy = {"--json-schema", kSchema, "--temperature", "0"};
  auto batched = run_vesper(generate_args(kPrompts, greedy), "batched");
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  const auto expected = json_lines(batched.out);
  ASSERT_EQ(expected.size(), kPrompts.size());
  for (const auto& e : expected) expect_valid_person(e);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto alone = run_vesper(generate_args({kPrompts[i]}, greedy), "alone");
    ASSERT_EQ(alone.exit_code, 0) << alone.err;
    EXPECT_EQ(json_lines(alone.out)[0]["token_ids"], expected[i]["token_ids"]) << kPrompts[i];
  }
  const std::vector<std::vector<std::string>> modes = {
      {"--max-num-batched-tokens", "7", "--enable-chunked-prefill"},
      {"--speculative-model", "[ngram]", "--num-speculative-tokens", "4"},
      {"--speculative-model", "../shared/models/stories-draft.gguf", "--num-speculative-tokens",
       "4"},
      {"--speculative-model", "../shared/models/medusa", "--num-speculative-tokens", "3"},
  };
  for (const auto& mode : modes) {
    std::vector<std::string> flags = greedy;
    flags.insert(flags.end(), mode.begin(), mode.end());
    auto r = run_vesper(generate_args(kPrompts, flags), "mode");
    ASSERT_EQ(r.exit_code, 0) << mode[0] << " " << mode[1] << ": " << r.err;
    const auto got = json_lines(r.out);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i]["token_ids"], expected[i]["token_ids"])
          << mode[0] << " " << mode[1] << " prompt " << i;
  }
}

TEST(CliStructured, GbnfGrammarFromTextAndFile) {
  const std::string gbnf =
      "root ::= \"The \" animal \" is \" [0-9]{1,2} \" years old.\"\nanimal ::= \"cat\" | \"dog\" "
      "| \"owl\"\n";
  const std::regex language("The (cat|dog|owl) is [0-9]{1,2} years old\\.");
  const std::string path = "/tmp/vesper_structured_" + std::to_string(::getpid()) + ".gbnf";
  std::ofstream(path) << gbnf;
  for (const std::vector<std::string>& flag : {std::vector<std::string>{"--grammar", gbnf},
                                               std::vector<std::string>{"--grammar-file", path}}) {
    for (int seed = 1; seed <= 3; ++seed) {
      std::vector<std::string> extra = flag;
      extra.insert(extra.end(), {"--temperature", "1", "--seed", std::to_string(seed)});
      auto r = run_vesper(generate_args(kPrompts, extra), "gbnf");
      ASSERT_EQ(r.exit_code, 0) << r.err;
      for (const auto& l : json_lines(r.out)) {
        EXPECT_EQ(l["finish_reason"], "stop");
        EXPECT_TRUE(std::regex_match(l["text"].get<std::string>(), language)) << l["text"];
      }
    }
  }
  std::remove(path.c_str());
}

TEST(CliStructured, BadGrammarsAndSchemasNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--grammar", "root ::= nope\n"}, "--grammar: line 1, column 10: undefined rule 'nope'"},
      {{"--grammar", "start ::= \"a\"\n"}, "--grammar: the grammar has no 'root' rule"},
      {{"--json-schema", "{\"type\": \"number\", \"multipleOf\": 2}"}, "multipleOf"},
      {{"--json-schema", "{not json"}, "--json-schema: not valid JSON"},
      {{"--json-schema", "{\"$ref\": \"#/$defs/missing\"}"}, "--json-schema"},
      {{"--grammar-file", "/nonexistent.gbnf"}, "--grammar-file"},
      {{"--grammar", "root ::= \"a\"\n", "--json-schema", "{}"}, "excludes"},
  };
  for (const auto& [flags, expected] : cases) {
    auto r = run_vesper(generate_args({"Hi"}, flags), "bad");
    EXPECT_NE(r.exit_code, 0) << flags[0];
    EXPECT_NE(r.err.find(expected), std::string::npos) << flags[0] << ": " << r.err;
  }
  // serve's tool-call flags, checked before the model loads.
  auto parser =
      run_vesper({"serve", kStoriesF32, "--port", "0", "--tool-call-parser", "json5"}, "parser");
  EXPECT_EQ(parser.exit_code, 1);
  EXPECT_NE(
      parser.err.find("--tool-call-parser: unknown tool call parser \"json5\" (choose hermes or "
                      "llama3_json)"),
      std::string::npos)
      << parser.err;
  auto alone =
      run_vesper({"serve", kStoriesF32, "--port", "0", "--enable-auto-tool-choice"}, "auto");
  EXPECT_EQ(alone.exit_code, 1);
  EXPECT_NE(alone.err.find("--enable-auto-tool-choice needs --tool-call-parser"), std::string::npos)
      << alone.err;
}

}  // namespace
}  // namespace vesper
