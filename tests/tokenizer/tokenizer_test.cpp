// Tokenizer behaviour on real vocabularies: the stories260K and llama-2 reference prompts,
// round trips, special tokens, decode rules, and speed on long inputs.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "sanitized.h"
#include "tokenizer/test_util.h"

namespace vesper::tokenizer {
namespace {

using tok_test::escape;
using tok_test::ids_to_string;
using tok_test::vocab;

const Tokenizer& stories() {
  return vocab(std::string(tok_test::kModelsDir) + "/stories260K.gguf");
}

TEST(TokenizerStories, EncodesReferencePromptsWithBos) {
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.encode("Once upon a time", true, false),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.encode("I believe the meaning of life is", true, false),
            (std::vector<int32_t>{1, 359, 329, 421, 417, 411, 360, 265, 284, 411, 303, 299, 373,
                                  397, 431, 411, 410, 293}));
  EXPECT_EQ(tok.encode("Hi how are you", true, false),
            (std::vector<int32_t>{1, 320, 417, 270, 327, 261, 276, 364}));
}

TEST(TokenizerStories, ReportsVocabularyFacts) {
  const Tokenizer& tok = stories();
  EXPECT_EQ(tok.type(), VocabType::kSpm);
  EXPECT_EQ(tok.n_vocab(), 512);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.sep_id(), std::nullopt);  // the file says 0xFFFFFFFF: no separator
  EXPECT_EQ(tok.pad_id(), std::nullopt);
  EXPECT_EQ(tok.nl_id(), tok.find_token("<0x0A>"));
  EXPECT_TRUE(tok.add_bos());
  EXPECT_FALSE(tok.add_eos());
  EXPECT_TRUE(tok.add_space_prefix());
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_TRUE(tok.is_control(1));
  EXPECT_TRUE(tok.is_unknown(0));
  EXPECT_TRUE(tok.is_byte(3));
}

TEST(TokenizerLlama2, EncodesReferencePrompt) {
  const Tokenizer& tok = vocab(std::string(tok_test::kModelsDir) + "/llama-2-tiny-random.gguf");
  EXPECT_EQ(tok.encode("Once upon a time", true, false),
            (std::vector<int32_t>{1, 9038, 2501, 263, 931}));
}

TEST(TokenizerSpm, FallsBackToByteTokensForUnknownCharacters) {
  const Tokenizer& tok = stories();  // 512 tokens: no CJK pieces
  const std::vector<int32_t> ids = tok.encode("\xE4\xBD\xA0", false, false);  // U+4F60
  std::vector<int32_t> expected;
  // "▁" may or may not merge with the first byte; the three bytes must appear as byte tokens.
  for (const char* byte : {"<0xE4>", "<0xBD>", "<0xA0>"}) expected.push_back(*tok.find_token(byte));
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 3, ids.end()), expected) << ids_to_string(ids);
}

// Texts whose decode(encode(x)) must give back x exactly. None has a space before . , ? ! or
// an apostrophe, which the clean-up of some BPE vocabularies removes on purpose.
const std::vector<std::string> kRoundTripTexts = {
    "Hello world",
    "  two leading spaces, and two trailing  ",
    "tabs\tand\nnewlines\n\n\r\nend",
    "\xF0\x9F\xA6\x99 llamas \xF0\x9F\x9A\x80 rockets "
    "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F fog",
    "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
    "apple\xE5\xB7\xA5\xE4\xBD\x9C"
    "1314151\xE5\xA4\xA9\xEF\xBD\x9E",
    "\xD0\xBD\xD0\xB5\xD1\x89\xD0\xBE \xD0\xBD\xD0\xB0 "
    "\xD0\x91\xD1\x8A\xD0\xBB\xD0\xB3\xD0\xB0\xD1\x80\xD1\x81\xD0\xBA\xD0\xB8",
    "\xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93\xE1\x9F\x8B\xE1\x9E\x8F\xE1\x9F\x82",
    "C\xE1\xBB\xAD"
    "a Vi\xE1\xBB\x87t",
    "int main() { return 0; }\n",
    "3.14159 and 1,000,000 and 007",
    "\xEA\xB0\x80\xEB\x82\x98\xEB\x8B\xA4 \xE3\x81\x8B\xE3\x81\xAA \xE3\x82\xAB\xE3\x83\x8A",
    "non\xC2\xA0"
    "breaking\xE2\x80\x83spaces",
};

class RoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTrip, DecodeOfEncodeGivesTheTextBack) {
  const std::string& name = GetParam();
  const Tokenizer& tok = name == "stories260K" ? stories() : vocab(name);
  for (const std::string& text : kRoundTripTexts) {
    const std::vector<int32_t> ids = tok.encode(text, false, false);
    EXPECT_EQ(escape(tok.decode(ids)), escape(text)) << name << ": " << ids_to_string(ids);
    EXPECT_EQ(escape(tok.decode(ids, /*skip_special=*/true)), escape(text)) << name;
  }
}

// WPM lowercases and drops accents, so it cannot round-trip; it is checked separately.
INSTANTIATE_TEST_SUITE_P(ReversibleVocabs, RoundTrip,
                         ::testing::Values("stories260K", "llama-spm", "phi-3", "gpt-2",
                                           "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                                           "starcoder", "refact"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(TokenizerDecode, SpmStripsTheSpacePrefixButKeepsItAfterADroppedBos) {
  const Tokenizer& tok = stories();
  const std::vector<int32_t> ids = tok.encode("Once upon a time", true, false);
  // As llama.cpp's llama_detokenize: the BOS renders when not skipped and takes the strip; when
  // skipped, the space after it stays.
  EXPECT_EQ(tok.decode(ids, false), "<s> Once upon a time");
  EXPECT_EQ(tok.decode(ids, true), " Once upon a time");
  EXPECT_EQ(tok.decode(std::span<const int32_t>(ids).subspan(1), true), "Once upon a time");
}

TEST(TokenizerDecode, CleansUpSpacesForVocabsThatAskForIt) {
  const Tokenizer& gpt2 = vocab("gpt-2");
  ASSERT_TRUE(gpt2.clean_spaces());
  const std::string text =
      "Hello , world . Is it ? Yes ! It 's , I 'm , we 're , they 've , don 't";
  EXPECT_EQ(gpt2.decode(gpt2.encode(text, false, false)),
            "Hello, world. Is it? Yes! It's, I'm, we're, they've, don 't");
  const Tokenizer& coder = vocab("deepseek-coder");
  ASSERT_FALSE(coder.clean_spaces());
  EXPECT_EQ(coder.decode(coder.encode(text, false, false)), text);
}

TEST(TokenizerDecode, ReplacesInvalidUtf8WithReplacementCharacter) {
  const Tokenizer& tok = vocab("llama-spm");
  const std::vector<int32_t> ids = {*tok.find_token("<0xE2>"), *tok.find_token("<0x80>"),
                                    *tok.find_token("a")};
  EXPECT_EQ(tok.decode(ids),
            "\xEF\xBF\xBD"
            "a");
}

TEST(TokenizerWpm, WrapsWithClsAndSepAndLowercases) {
  const Tokenizer& tok = vocab("bert-bge");
  EXPECT_EQ(tok.type(), VocabType::kWpm);
  const std::vector<int32_t> ids = tok.encode("Hello, World!", true, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{101, 7592, 1010, 2088, 999, 102}));
  EXPECT_EQ(tok.decode(ids), "[CLS] hello, world![SEP]");
  EXPECT_EQ(tok.decode(ids, true), " hello, world!");
}

TEST(TokenizerPieces, FollowLlamaCppTokenToPiece) {
  const Tokenizer& spm = vocab("llama-spm");
  EXPECT_EQ(spm.token_to_piece(*spm.find_token("<0x0A>"), false), "\n");
  EXPECT_EQ(spm.token_to_piece(*spm.find_token("\xE2\x96\x81Hello"), false), " Hello");
  EXPECT_EQ(spm.token_to_piece(1, true), "<s>");
  EXPECT_EQ(spm.token_to_piece(1, false), "");
  EXPECT_EQ(spm.token_text(1), "<s>");
  const Tokenizer& gpt2 = vocab("gpt-2");
  EXPECT_EQ(gpt2.token_to_piece(*gpt2.find_token("\xC4\xA0world"), false), " world");
  EXPECT_EQ(gpt2.token_to_piece(50256, true), "<|endoftext|>");
  EXPECT_EQ(gpt2.token_to_piece(50256, false), "");
  EXPECT_EQ(gpt2.find_token("no such token"), std::nullopt);
}

TEST(TokenizerSpecial, ParsesControlTokensOnlyWhenAsked) {
  const Tokenizer& gpt2 = vocab("gpt-2");
  const std::string text = "a<|endoftext|>b";
  const std::vector<int32_t> parsed = gpt2.encode(text, false, true);
  ASSERT_EQ(parsed.size(), 3u) << ids_to_string(parsed);
  EXPECT_EQ(parsed[1], 50256);
  const std::vector<int32_t> plain = gpt2.encode(text, false, false);
  EXPECT_GT(plain.size(), 3u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 50256), 0);
  EXPECT_EQ(gpt2.decode(plain), text);
}

TEST(TokenizerSpecial, SpmAddsTheSpacePrefixAfterASpecialToken) {
  const Tokenizer& tok = vocab("llama-spm");
  const int32_t hello = *tok.find_token("\xE2\x96\x81Hello");
  EXPECT_EQ(tok.encode("<s>Hello", false, true), (std::vector<int32_t>{1, hello}));
  EXPECT_EQ(tok.encode("<s>Hello", true, true), (std::vector<int32_t>{1, 1, hello}));
  EXPECT_EQ(tok.encode("Hello</s>", true, true), (std::vector<int32_t>{1, hello, 2}));
}

TEST(TokenizerSpecial, Phi3ChatTokensSwallowTheWhitespaceAfterThem) {
  const Tokenizer& tok = vocab("phi-3");
  const int32_t user = *tok.find_token("<|user|>");
  const int32_t end = *tok.find_token("<|end|>");
  const int32_t assistant = *tok.find_token("<|assistant|>");
  const std::vector<int32_t> hello = tok.encode("Hello", false, false);
  std::vector<int32_t> expected = {user};
  expected.insert(expected.end(), hello.begin(), hello.end());
  expected.push_back(end);
  expected.push_back(assistant);
  EXPECT_EQ(tok.encode("<|user|>\nHello<|end|>\n<|assistant|>", false, true), expected);
  EXPECT_EQ(tok.eot_id(), end);
  EXPECT_TRUE(tok.is_eog(end));
  EXPECT_TRUE(tok.is_eog(*tok.eos_id()));
}

TEST(TokenizerSpecial, UserDefinedTokensAreAlwaysMatched) {
  const Tokenizer& tok = vocab("deepseek-coder");
  const int32_t eot = *tok.find_token("<|EOT|>");
  EXPECT_TRUE(tok.is_user_defined(eot));
  const std::vector<int32_t> ids = tok.encode("x<|EOT|>y", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), 1) << ids_to_string(ids);
  // mpt's added whitespace tokens: the longest run wins.
  const Tokenizer& mpt = vocab("mpt");
  const std::vector<int32_t> spaces = mpt.encode("a      b", false, false);
  EXPECT_EQ(std::count(spaces.begin(), spaces.end(), *mpt.find_token("      ")), 1)
      << ids_to_string(spaces);
}

TEST(TokenizerSpecial, AddsBosOnlyWhereTheVocabularyDoes) {
  const Tokenizer& coder = vocab("deepseek-coder");
  ASSERT_TRUE(coder.add_bos());
  EXPECT_EQ(coder.encode("x", true, false).front(), 32013);
  const Tokenizer& gpt2 = vocab("gpt-2");
  EXPECT_FALSE(gpt2.add_bos());
  EXPECT_EQ(gpt2.encode("x", true, false), gpt2.encode("x", false, false));
  EXPECT_EQ(vocab("llama-spm").encode("", true, false), (std::vector<int32_t>{1}));
  EXPECT_TRUE(vocab("llama-spm").encode("", false, false).empty());
}

// The server tokenizes every request: long inputs must cost linear time. A quadratic step
// anywhere (special-token scan, regex, merges) would take minutes at these sizes.
// Under a sanitizer (VESPER_SANITIZED) the inputs are a quarter as long: a quadratic step would
// still take a minute or more there.
TEST(TokenizerSpeed, LongInputsEncodeInLinearTime) {
  const size_t shrink = testing_util::sanitized() ? 4 : 1;
  std::string paragraph;
  for (const std::string& t : kRoundTripTexts) paragraph += t + " ";
  std::string text;
  while (text.size() < (1u << 18) / shrink) text += paragraph;
  const size_t n = 100000 / shrink;
  const std::vector<std::string> adversarial = {
      std::string(n, ' ') + "x",  std::string(n, ' ') + "\xF0\x9F\x98\x80",
      std::string(n, '\n') + "x", std::string(n, 'a'),
      std::string(n, '!'),        std::string(n, '3'),
  };
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "deepseek-coder", "falcon", "mpt",
                           "starcoder", "bert-bge"}) {
    const Tokenizer& tok = vocab(name);
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(text, false, false);
    for (const std::string& a : adversarial)
      EXPECT_FALSE(tok.encode(a, false, false).empty()) << name;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GT(ids.size(), text.size() / 16) << name;
    EXPECT_LT(seconds, 20.0) << name << " took " << seconds << " s for " << text.size() / 1024
                             << " KiB plus adversarial inputs";
  }
}

TEST(TokenizerThreads, ConcurrentEncodesGiveTheSameIds) {
  for (const char* name : {"gpt-2", "llama-spm", "bert-bge"}) {
    // A fresh tokenizer, so lazily built state (the WPM category table, per-thread regex
    // scratch) is first touched from several threads at once.
    Result<Tokenizer> tok = tok_test::load_tokenizer(std::string(tok_test::kVectorsDir) +
                                                     "/ggml-vocab-" + name + ".gguf");
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    std::vector<std::vector<int32_t>> results(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < results.size(); ++t) {
      threads.emplace_back([&, t] {
        for (const std::string& text : kRoundTripTexts) {
          const std::vector<int32_t> ids = tok->encode(text, true, true);
          results[t].insert(results[t].end(), ids.begin(), ids.end());
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (size_t t = 1; t < results.size(); ++t) EXPECT_EQ(results[t], results[0]) << name;
  }
}

TEST(TokenizerCopies, ShareTheVocabularyAndStayUsableAfterTheOriginalGoes) {
  std::optional<Tokenizer> copy;
  {
    Result<Tokenizer> tok =
        tok_test::load_tokenizer(std::string(tok_test::kModelsDir) + "/stories260K.gguf");
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    copy = *tok;
  }
  EXPECT_EQ(copy->encode("Once upon a time", true, false),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

}  // namespace
}  // namespace vesper::tokenizer
