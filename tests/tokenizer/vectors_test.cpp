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
using tok_test::read_cases;
using tok_test::read_expected;
using tok_test::read_file;

// Every vocabulary in the vectors directory. VectorsDirectoryHoldsExactlyTheseVocabs keeps this
// list honest, so a vocabulary added there cannot be silently skipped.
const std::vector<std::string> kVocabs = {
    "bert-bge", "deepseek-coder", "deepseek-llm", "falcon",    "gpt-2", "llama-spm",
    "mpt",      "phi-3",          "refact",       "starcoder",
};

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
    const std::vector<int32_t> got =
        tok->encode(cases[i], /*add_special=*/false, /*parse_special=*/false);
    if (got != expected[i]) {
      ++failures;
      ADD_FAILURE() << "vocab " << GetParam() << ", case " << i << " \"" << escape(cases[i])
                    << "\"\n"
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
