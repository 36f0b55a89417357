// The byte-level helpers under decoding: UTF-8 repair, lenient decoding, the space clean-up
// and its safe cut points, and the Unicode facts the WordPiece normalizer uses.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/detokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

TEST(Utf8Repair, ReplacesEachMaximalInvalidSubpart) {
  // Unicode's examples: overlong, surrogate, truncated and stray bytes.
  EXPECT_EQ(sanitize_utf8("a\xC0\xAF"
                          "b"),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xE2\x80"
                          "x"),
            "\xEF\xBF\xBD"
            "x");
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\xA6"), "\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\x80\xBF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("ok \xF0\x9F\xA6\x99"), "ok \xF0\x9F\xA6\x99");
  EXPECT_TRUE(is_valid_utf8("ok \xF0\x9F\xA6\x99"));
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(Utf8Repair, StreamingInPiecesEqualsRepairingWhole) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const std::string alphabet[] = {
      "a",    "\x80", "\xBF", "\xC3", "\xE2", "\xF0",     "\x9F",         "\xA6",
      "\xED", "\xA0", "\xF4", "\x90", "\xFF", "\xC3\xA9", "\xE2\x80\x99", "\xF0\x9F\xA6\x99"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % std::size(alphabet)];
    std::string streamed;
    std::string pending;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t take = 1 + rng() % 3;
      pending += text.substr(pos, take);
      pos += take;
      pending.erase(0, repair_utf8(pending, false, &streamed));
    }
    repair_utf8(pending, true, &streamed);
    ASSERT_EQ(streamed, sanitize_utf8(text));
    ASSERT_TRUE(is_valid_utf8(streamed));
  }
}

TEST(Utf8Lenient, DecodesLikeLlamaCpp) {
  // A broken sequence costs one U+FFFD per byte that starts it; decoding resumes right after.
  EXPECT_EQ(decode_utf8_lenient("a\xE2\x80"
                                "b"),
            (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD, 'b'}));
  EXPECT_EQ(to_valid_utf8_lenient("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(to_valid_utf8_lenient("\xFF"), "\xEF\xBF\xBD");
}

TEST(CleanUpSpaces, RemovesTheSpacesHuggingFaceRemoves) {
  EXPECT_EQ(clean_up_spaces("a , b . c ? d ! e"), "a, b. c? d! e");
  EXPECT_EQ(clean_up_spaces("it 's I 'm we 're they 've don 't I 'd we 'll"),
            "it's I'm we're they've don 't I 'd we 'll");
  EXPECT_EQ(clean_up_spaces("a ' b"), "a'b");
  EXPECT_EQ(clean_up_spaces(" ."), ".");
  EXPECT_EQ(clean_up_spaces(""), "");
}

TEST(CleanUpSpaces, CleaningAtSafeCutsEqualsCleaningWhole) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const char alphabet[] = " ' ' .,?!smrevtdlax";
  for (int round = 0; round < 5000; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 16);
    for (int i = 0; i < n; ++i) text.push_back(alphabet[rng() % (sizeof(alphabet) - 1)]);
    // Feed in random pieces; after each, clean and emit up to the safe cut.
    std::string out;
    std::string pending;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t take = 1 + rng() % 3;
      pending += text.substr(pos, take);
      pos += take;
      const size_t cut = clean_up_safe_cut(pending);
      out += clean_up_spaces(pending.substr(0, cut));
      pending.erase(0, cut);
    }
    out += clean_up_spaces(pending);
    ASSERT_EQ(out, clean_up_spaces(text)) << "text \"" << text << "\"";
  }
}

TEST(UnicodeFacts, CategoriesComeFromPcre2) {
  EXPECT_TRUE(codepoint_flags(' ') & kCpWhitespace);
  EXPECT_TRUE(codepoint_flags(0x3000) & kCpWhitespace);  // ideographic space
  EXPECT_TRUE(codepoint_flags('a') & kCpLetter);
  EXPECT_TRUE(codepoint_flags(0x4F60) & kCpLetter);
  EXPECT_TRUE(codepoint_flags('7') & kCpNumber);
  EXPECT_TRUE(codepoint_flags(0xBD) & kCpNumber);  // one half
  EXPECT_TRUE(codepoint_flags(',') & kCpPunctuation);
  EXPECT_TRUE(codepoint_flags('$') & kCpSymbol);
  EXPECT_TRUE(codepoint_flags(0x1F999) & kCpSymbol);  // llama emoji
  EXPECT_TRUE(codepoint_flags(0x0301) & kCpMark);     // combining acute
  EXPECT_TRUE(codepoint_flags(0x200D) & kCpControl);  // zero width joiner (Cf)
  EXPECT_TRUE(codepoint_flags(0x0378) & kCpControl);  // unassigned (Cn)
}

TEST(UnicodeFacts, LowercaseAndNfdBase) {
  EXPECT_EQ(to_lower('A'), static_cast<uint32_t>('a'));
  EXPECT_EQ(to_lower(0x0411), 0x0431u);  // Cyrillic Be
  EXPECT_EQ(to_lower('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(nfd_base(0xFC), static_cast<uint32_t>('u'));    // u with diaeresis
  EXPECT_EQ(nfd_base(0x1EED), static_cast<uint32_t>('u'));  // u with horn and hook above
  EXPECT_EQ(nfd_base('x'), static_cast<uint32_t>('x'));
}

TEST(UnicodeFacts, ByteLevelAlphabetIsABijection) {
  EXPECT_EQ(byte_to_bpe_char(' '), "\xC4\xA0");  // U+0120
  EXPECT_EQ(byte_to_bpe_char('a'), "a");
  for (int b = 0; b < 256; ++b) {
    const std::vector<uint32_t> cpts =
        decode_utf8_lenient(byte_to_bpe_char(static_cast<uint8_t>(b)));
    ASSERT_EQ(cpts.size(), 1u);
    EXPECT_EQ(bpe_char_to_byte(cpts[0]), b);
  }
}

}  // namespace
}  // namespace vesper::tokenizer
