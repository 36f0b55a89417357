// Tokenizers from GGUF files written here: every malformed or missing piece of tokenizer
// metadata is a clear error naming the file and the key; small valid vocabularies show the
// merge rules without a real model.
#include <gtest/gtest.h>

#include "tokenizer/synthetic_vocab.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tokenizer.h"

namespace vesper::tokenizer {
namespace {

using gguf::Value;
using gguf::ValueType;
using tok_test::Metadata;

Result<Tokenizer> load(const std::string& name, const Metadata& md) {
  return tok_test::load_tokenizer(tok_test::write_gguf(name, md));
}

// Expects `result` to fail with a message naming the file and each of `needles`.
void expect_error(const Result<Tokenizer>& result, const std::string& name,
                  std::initializer_list<std::string> needles) {
  ASSERT_FALSE(result.ok()) << name << " loaded, but should not have";
  const std::string& msg = result.error().message;
  EXPECT_NE(msg.find("vesper_tokenizer_" + name + ".gguf"), std::string::npos) << msg;
  for (const std::string& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

TEST(TokenizerMetadata, SyntheticVocabulariesLoad) {
  ASSERT_TRUE(load("spm_ok", tok_test::spm_metadata()).ok());
  Result<Tokenizer> bpe = load("bpe_ok", tok_test::bpe_metadata());
  ASSERT_TRUE(bpe.ok()) << bpe.error().message;
}

TEST(TokenizerMetadata, MissingTokensIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::remove_key(&md, "tokenizer.ggml.tokens");
  expect_error(load("no_tokens", md), "no_tokens", {"tokenizer.ggml.tokens", "missing"});
}

TEST(TokenizerMetadata, TokensOfTheWrongTypeAreAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.tokens", Value::i32_array({1, 2, 3}));
  expect_error(load("int_tokens", md), "int_tokens", {"tokenizer.ggml.tokens", "string"});
}

TEST(TokenizerMetadata, EmptyTokensIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.tokens", Value::array(ValueType::kString, {}));
  expect_error(load("empty_tokens", md), "empty_tokens", {"tokenizer.ggml.tokens", "empty"});
}

TEST(TokenizerMetadata, ScoresLengthMismatchIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.scores", Value::f32_array({0.0f, 1.0f}));
  expect_error(load("short_scores", md), "short_scores",
               {"tokenizer.ggml.scores", "has 2 entries, expected 265"});
}

TEST(TokenizerMetadata, ScoresOfTheWrongTypeAreAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.scores", Value::string("high"));
  expect_error(load("string_scores", md), "string_scores",
               {"tokenizer.ggml.scores", "float32 or int32"});
}

TEST(TokenizerMetadata, IntegerScoresAreAccepted) {
  Metadata md = tok_test::spm_metadata();
  std::vector<int32_t> scores(265, 0);
  tok_test::set_key(&md, "tokenizer.ggml.scores", Value::i32_array(scores));
  Result<Tokenizer> tok = load("int_scores", md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->token_score(264), 0.0f);
}

TEST(TokenizerMetadata, TokenTypeLengthMismatchIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.token_type", Value::i32_array({1, 1, 1}));
  expect_error(load("short_types", md), "short_types",
               {"tokenizer.ggml.token_type", "has 3 entries"});
}

TEST(TokenizerMetadata, MissingModelIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::remove_key(&md, "tokenizer.ggml.model");
  expect_error(load("no_model", md), "no_model", {"tokenizer.ggml.model"});
}

TEST(TokenizerMetadata, UnknownModelIsNamedWithTheSupportedOnes) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.model", Value::string("xyz"));
  expect_error(load("model_xyz", md), "model_xyz",
               {"tokenizer.ggml.model", "\"xyz\"", "\"llama\"", "\"gpt2\"", "\"bert\""});
}

TEST(TokenizerMetadata, UnknownPreTokenizerIsNamedWithTheSupportedOnes) {
  Metadata md = tok_test::bpe_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.pre", Value::string("mystery"));
  expect_error(
      load("pre_mystery", md), "pre_mystery",
      {"tokenizer.ggml.pre", "\"mystery\"", "llama-bpe", "qwen2", "deepseek-llm", "gpt-2"});
}

TEST(TokenizerMetadata, BpeWithoutMergesIsAnError) {
  Metadata md = tok_test::bpe_metadata();
  tok_test::remove_key(&md, "tokenizer.ggml.merges");
  expect_error(load("no_merges", md), "no_merges", {"tokenizer.ggml.merges", "missing"});
}

TEST(TokenizerMetadata, MalformedMergeIsAnError) {
  Metadata md = tok_test::bpe_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.merges", Value::string_array({"a b", "ab"}));
  expect_error(load("bad_merge", md), "bad_merge", {"tokenizer.ggml.merges", "entry 1", "\"ab\""});
}

TEST(TokenizerMetadata, DuplicateTokenIsAnError) {
  Metadata md = tok_test::spm_metadata();
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "a", "a"};
  tok_test::set_key(&md, "tokenizer.ggml.tokens", Value::string_array(tokens));
  tok_test::remove_key(&md, "tokenizer.ggml.scores");
  tok_test::remove_key(&md, "tokenizer.ggml.token_type");
  expect_error(load("duplicate", md), "duplicate",
               {"tokenizer.ggml.tokens", "\"a\" twice", "ids 3 and 4"});
}

TEST(TokenizerMetadata, SpecialIdOfTheWrongTypeIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.bos_token_id", Value::string("one"));
  expect_error(load("string_bos", md), "string_bos", {"tokenizer.ggml.bos_token_id"});
}

TEST(TokenizerMetadata, SpecialIdOutsideTheVocabularyKeepsTheDefault) {
  // Real files write 0xFFFFFFFF for "none"; llama.cpp ignores such ids.
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.bos_token_id", Value::u32(0xFFFFFFFFu));
  tok_test::set_key(&md, "tokenizer.ggml.padding_token_id", Value::u32(100000));
  Result<Tokenizer> tok = load("bos_out_of_range", md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->pad_id(), std::nullopt);
}

TEST(TokenizerMetadata, AddBosWithoutABosTokenIsAnError) {
  Metadata md = tok_test::bpe_metadata();
  tok_test::remove_key(&md,
                       "tokenizer.ggml.bos_token_id");  // the default (11) is a byte token here
  tok_test::set_key(&md, "tokenizer.ggml.tokens", Value::string_array({"a", "b", "ab"}));
  tok_test::set_key(&md, "tokenizer.ggml.token_type", Value::i32_array({1, 1, 1}));
  tok_test::set_key(&md, "tokenizer.ggml.eos_token_id", Value::u32(2));
  tok_test::set_key(&md, "tokenizer.ggml.add_bos_token", Value::boolean(true));
  expect_error(load("add_bos_no_bos", md), "add_bos_no_bos", {"tokenizer.ggml.add_bos_token"});
}

TEST(TokenizerMetadata, BoolKeyOfTheWrongTypeIsAnError) {
  Metadata md = tok_test::spm_metadata();
  tok_test::set_key(&md, "tokenizer.ggml.add_bos_token", Value::string("yes"));
  expect_error(load("string_add_bos", md), "string_add_bos", {"tokenizer.ggml.add_bos_token"});
}

TEST(TokenizerSyntheticSpm, MergesTheHighestScoringPairFirst) {
  Result<Tokenizer> tok = load("spm_merge", tok_test::spm_metadata());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // "ab" (-4) beats "\u2581a" (-5), and then "\u2581ab" exists: one token.
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{*tok->find_token("\xE2\x96\x81"
                                                                                    "ab")}));
  // Without "b", "\u2581a" is the only merge.
  EXPECT_EQ(tok->encode("a", false, false), (std::vector<int32_t>{*tok->find_token("\xE2\x96\x81"
                                                                                   "a")}));
  // Characters that are no token fall back to their bytes.
  EXPECT_EQ(tok->encode("\xC3\xA9", false, false),
            (std::vector<int32_t>{*tok->find_token("\xE2\x96\x81"), *tok->find_token("<0xC3>"),
                                  *tok->find_token("<0xA9>")}));
  EXPECT_EQ(tok->decode(tok->encode("ab \xC3\xA9", true, false), true), " ab \xC3\xA9");
}

TEST(TokenizerSyntheticSpm, AddSpacePrefixCanBeTurnedOff) {
  Metadata md = tok_test::spm_metadata();
  md.emplace_back("tokenizer.ggml.add_space_prefix", Value::boolean(false));
  Result<Tokenizer> tok = load("spm_no_prefix", md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{*tok->find_token("ab")}));
  EXPECT_EQ(tok->decode(tok->encode(" ab", false, false)), " ab");
}

TEST(TokenizerSyntheticBpe, MergesByRankWithinAWord) {
  Result<Tokenizer> tok = load("bpe_merge", tok_test::bpe_metadata());
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const int32_t space_ab = *tok->find_token(
      "\xC4\xA0"
      "ab");
  const int32_t ab = *tok->find_token("ab");
  // "Ġ a" has rank 0, so " ab" is Ġa + b -> "Ġa b" (rank 2) -> "Ġab".
  EXPECT_EQ(tok->encode(" ab", false, false), (std::vector<int32_t>{space_ab}));
  EXPECT_EQ(tok->encode("ab ab", false, false), (std::vector<int32_t>{ab, space_ab}));
  EXPECT_EQ(tok->decode(tok->encode("ab ab\n\xF0\x9F\xA6\x99", false, false)),
            "ab ab\n\xF0\x9F\xA6\x99");
  EXPECT_EQ(tok->eos_id(), tok->find_token("<|endoftext|>"));
  EXPECT_FALSE(tok->add_bos());
}

}  // namespace
}  // namespace vesper::tokenizer
