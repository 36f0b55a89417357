// llama.cpp's official tokenizer vectors (../shared/tokenizer-vectors/): for every vocabulary,
// each .inp case must encode (add_special = false, parse_special = false) to the ids in .out,
// which the reference Hugging Face tokenizers produced. One test per vocabulary, so a failure
// names the vocabulary and the case.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/test_util.h"
#include "tokenizer/tokenizer.h"

namespace vesper::tokenizer {
namespace {

using tok_test::escape;
using tok_test::ids_to_string;
using tok_test::kVectorsDir;

// Every vocabulary in the vectors directory. VectorsDirectoryHoldsExactlyTheseVocabs keeps this
// list honest, so a vocabulary added there cannot be silently skipped.
const std::vector<std::string> kVocabs = {
    "bert-bge", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
    "llama-spm", "mpt", "phi-3", "refact", "starcoder",
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// .inp: cases joined by "\n__ggml_vocab_test__\n", which also ends the file.
std::vector<std::string> read_cases(const std::string& path) {
  const std::string text = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(sep, pos);
    if (hit == std::string::npos) break;
    cases.push_back(text.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  return cases;
}

// .out: one line per case, ids separated by spaces (each line starts with one).
std::vector<std::vector<int32_t>> read_expected(const std::string& path) {
  std::vector<std::vector<int32_t>> lines;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    std::vector<int32_t> ids;
    std::istringstream words(line);
    long long id = 0;
    while (words >> id) ids.push_back(static_cast<int32_t>(id));
    lines.push_back(std::move(ids));
  }
  return lines;
}

class TokenizerVectors : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerVectors, EncodesEveryCaseLikeTheReference) {
  const std::string base = std::string(kVectorsDir) + "/ggml-vocab-" + GetParam() + ".gguf";
  Result<Tokenizer> tok = tok_test::load_tokenizer(base);
  ASSERT_TRUE(tok.ok()) << tok.error().message;

  const std::vector<std::string> cases = read_cases(base + ".inp");
  const std::vector<std::vector<int32_t>> expected = read_expected(base + ".out");
  ASSERT_EQ(cases.size(), 46u) << base << ".inp";
  ASSERT_EQ(expected.size(), cases.size()) << base << ".out";

  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> got = tok->encode(cases[i], /*add_special=*/false, /*parse_special=*/false);
    if (got != expected[i]) {
      ++failures;
      ADD_FAILURE() << "vocab " << GetParam() << ", case " << i << " \"" << escape(cases[i]) << "\"\n"
                    << "  expected " << ids_to_string(expected[i]) << "\n"
                    << "  got      " << ids_to_string(got);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size() << " cases in " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(AllVocabs, TokenizerVectors, ::testing::ValuesIn(kVocabs),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(TokenizerVectorsDirectory, HoldsExactlyTheseVocabs) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(kVectorsDir)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = "ggml-vocab-";
    const std::string suffix = ".gguf";
    if (name.size() > prefix.size() + suffix.size() && name.rfind(prefix, 0) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      found.push_back(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> listed = kVocabs;
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(found, listed) << "update kVocabs in vectors_test.cpp";
}

}  // namespace
}  // namespace vesper::tokenizer
