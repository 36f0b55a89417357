// The BPE pre-tokenizers: what each preset's regexes (PCRE2, applied in sequence) cut a text
// into. These pin the regex semantics independently of any vocabulary.
#include <gtest/gtest.h>

#include "tokenizer/bpe_presets.h"
#include "tokenizer/regex_splitter.h"
#include "tokenizer/test_util.h"

namespace vesper::tokenizer {
namespace {

std::vector<std::string> pieces(std::string_view pre, std::string_view text) {
  std::optional<BpePreset> preset = find_bpe_preset(pre);
  VESPER_CHECK(preset.has_value(), "no preset %s", std::string(pre).c_str());
  Result<RegexSplitter> splitter = RegexSplitter::compile(preset->patterns);
  VESPER_CHECK(splitter.ok(), "%s", splitter.ok() ? "" : splitter.error().message.c_str());
  std::vector<std::string> out;
  for (const Span& s : splitter->split(text))
    out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizer, EveryPresetCompiles) {
  for (std::string_view name : bpe_preset_names()) {
    std::optional<BpePreset> preset = find_bpe_preset(name);
    ASSERT_TRUE(preset.has_value()) << name;
    Result<RegexSplitter> splitter = RegexSplitter::compile(preset->patterns);
    EXPECT_TRUE(splitter.ok()) << name << ": " << (splitter.ok() ? "" : splitter.error().message);
  }
  EXPECT_FALSE(find_bpe_preset("no-such-pre").has_value());
  EXPECT_TRUE(find_bpe_preset("").has_value());  // a missing key means "default"
}

TEST(PreTokenizer, Gpt2SplitsWordsNumbersAndTrailingSpaces) {
  EXPECT_EQ(pieces("gpt-2", "Hello world, it's 2024!  ok\n"),
            (Pieces{"Hello", " world", ",", " it", "'s", " 2024", "!", " ", " ok", "\n"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThreeAndKeepsNewlinesWithPunctuation) {
  EXPECT_EQ(pieces("llama-bpe", "I'm 12345 ok!!\n\n  x"),
            (Pieces{"I", "'m", " ", "123", "45", " ok", "!!\n\n", " ", " x"}));
  EXPECT_EQ(pieces("llama3", "HELLO'S\r\nthere"), (Pieces{"HELLO", "'S", "\r\n", "there"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(pieces("qwen2", "x 123"), (Pieces{"x", " ", "1", "2", "3"}));
}

TEST(PreTokenizer, SequencedRegexesCutThePiecesOfEarlierOnes) {
  // starcoder: digits first, then GPT-2's pattern inside what is left.
  EXPECT_EQ(pieces("starcoder", "abc123 def"), (Pieces{"abc", "1", "2", "3", " def"}));
  // deepseek-coder: newlines, letters, punctuation, CJK, digits, each refining the last.
  EXPECT_EQ(pieces("deepseek-coder", "a\nb+c"), (Pieces{"a", "\n", "b", "+", "c"}));
  // falcon: punctuation runs are cut out before GPT-2's pattern sees them.
  EXPECT_EQ(pieces("falcon", "a...b"), (Pieces{"a", "...", "b"}));
}

TEST(PreTokenizer, LettersAndNumbersFollowUnicodeCategories) {
  // Cyrillic letters, Devanagari digits and the ideographic space.
  EXPECT_EQ(pieces("gpt-2", "\xD0\xBC\xD0\xB8\xD1\x80 \xE0\xA5\xA8\xE0\xA5\xA9"),
            (Pieces{"\xD0\xBC\xD0\xB8\xD1\x80", " \xE0\xA5\xA8\xE0\xA5\xA9"}));
}

TEST(PreTokenizer, EmptyMatchesOnlyMarkCuts) {
  // superbpe's second pattern is a pure lookahead: it cuts digit runs into groups of three
  // from the right without producing empty pieces.
  EXPECT_EQ(pieces("superbpe", "1234567"), (Pieces{"1", "234", "567"}));
}

}  // namespace
}  // namespace vesper::tokenizer
