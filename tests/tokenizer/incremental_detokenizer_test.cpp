// IncrementalDetokenizer: deltas are whole UTF-8 characters, and over a sequence they add up
// to Tokenizer::decode exactly, on every vocabulary type.
#include "tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>

#include "tokenizer/synthetic_vocab.h"
#include "tokenizer/test_util.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

using tok_test::escape;
using tok_test::ids_to_string;
using tok_test::vocab;

// Feeds `ids` one by one; returns the deltas (the last one from flush()).
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                DetokenizeOptions options) {
  IncrementalDetokenizer detok(tok, options);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.emplace_back(detok.feed(id));
  deltas.emplace_back(detok.flush());
  return deltas;
}

std::string concat(const std::vector<std::string>& parts) {
  std::string s;
  for (const std::string& p : parts) s += p;
  return s;
}

TEST(IncrementalDetokenizer, HoldsBackACharacterSplitOverByteTokens) {
  const Tokenizer& tok = vocab("llama-spm");
  // U+2019 (E2 80 99) and U+1F999 (F0 9F A6 99) spelled with byte-fallback tokens.
  std::vector<int32_t> ids;
  for (const char* b : {"<0xE2>", "<0x80>", "<0x99>", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"})
    ids.push_back(*tok.find_token(b));
  const std::vector<std::string> deltas = stream(tok, ids, {});
  const std::vector<std::string> expected = {"", "", "\xE2\x80\x99",     "",
                                             "", "", "\xF0\x9F\xA6\x99", ""};
  EXPECT_EQ(deltas, expected);
}

TEST(IncrementalDetokenizer, ReplacesInvalidSequencesAsSoonAsTheyAreKnown) {
  const Tokenizer& tok = vocab("llama-spm");
  const int32_t e2 = *tok.find_token("<0xE2>");
  const int32_t a = *tok.find_token("a");
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.feed(e2), "");
  EXPECT_EQ(detok.feed(a),
            "\xEF\xBF\xBD"
            "a");  // E2 followed by 'a' can never complete
  EXPECT_EQ(detok.feed(e2), "");
  EXPECT_EQ(detok.flush(), "\xEF\xBF\xBD");  // incomplete at the end
}

TEST(IncrementalDetokenizer, StripsTheFirstSpaceUnlessContinuing) {
  const Tokenizer& tok = vocab("llama-spm");
  const std::vector<int32_t> ids = tok.encode("upon a time", false, false);  // "▁upon" "▁a" "▁time"
  EXPECT_EQ(concat(stream(tok, ids, {})), "upon a time");
  EXPECT_EQ(concat(stream(tok, ids, {.skip_special = false, .continuation = true})),
            " upon a time");
  // After a BOS that is skipped the space stays (llama.cpp's rule), exactly as decode() does.
  std::vector<int32_t> with_bos = tok.encode("upon a time", true, false);
  EXPECT_EQ(concat(stream(tok, with_bos, {.skip_special = true})), tok.decode(with_bos, true));
}

TEST(IncrementalDetokenizer, MatchesDecodeWithSpaceCleanUp) {
  const Tokenizer& tok = vocab("gpt-2");
  const std::string text = "Hello , world . It 's , I 'm , they 've , don 't ' quoted ' end ?";
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  const std::vector<std::string> deltas = stream(tok, ids, {});
  EXPECT_EQ(concat(deltas), tok.decode(ids));
  EXPECT_EQ(concat(deltas), "Hello, world. It's, I'm, they've, don 't'quoted'end?");
}

TEST(IncrementalDetokenizer, DropsATrailingEosOnlyWhenItIsLast) {
  // EOS as a normal token renders as "</s>", so dropping it or not is visible.
  tok_test::Metadata md = tok_test::spm_metadata();
  md.emplace_back("tokenizer.ggml.add_eos_token", gguf::Value::boolean(true));
  for (auto& [key, value] : md) {
    if (key != "tokenizer.ggml.token_type") continue;
    gguf::Array types = *value.as_array();
    types.items[2] = gguf::Value::i32(1);
    value = gguf::Value::array(types.element_type, types.items);
  }
  Result<Tokenizer> tok = tok_test::load_tokenizer(tok_test::write_gguf("detok_add_eos", md));
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const std::vector<int32_t> ids = tok->encode("ab", true, false);  // <s> ▁ab </s>
  ASSERT_EQ(ids.back(), 2);
  EXPECT_EQ(tok->decode(ids, true), " ab");
  EXPECT_EQ(tok->decode(ids, false), "<s> ab</s>");
  EXPECT_EQ(concat(stream(*tok, ids, {.skip_special = true})), tok->decode(ids, true));
  EXPECT_EQ(concat(stream(*tok, ids, {.skip_special = false})), tok->decode(ids, false));
  std::vector<int32_t> eos_inside = ids;
  eos_inside.push_back(ids[1]);
  EXPECT_EQ(tok->decode(eos_inside, true), " ab</s> ab");
  EXPECT_EQ(concat(stream(*tok, eos_inside, {.skip_special = true})),
            tok->decode(eos_inside, true));
}

const std::vector<std::string> kStreamTexts = {
    "Once upon a time, there was a llama \xF0\x9F\xA6\x99 who liked C++.",
    "\xE6\x88\x91\xE6\x83\xB3\xE5\x9C\xA8"
    "apple\xE5\xB7\xA5\xE4\xBD\x9C\n\n  indented\tline",
    "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 , \xD0\xBC\xD0\xB8\xD1\x80 ! It 's 'quoted' "
    "?",
    "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F "
    "\xE1\x9E\x80\xE1\x9E\xB6\xE1\x9E\x93\xE1\x9F\x8B C\xE1\xBB\xAD"
    "a",
};

const std::vector<std::string> kAllVocabs = {"stories260K",  "llama-spm",      "phi-3",   "gpt-2",
                                             "deepseek-llm", "deepseek-coder", "falcon",  "mpt",
                                             "starcoder",    "refact",         "bert-bge"};

class IncrementalDetokenizerVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalDetokenizerVocab, DeltasAreWholeCharactersAndAddUpToDecode) {
  const Tokenizer& tok = vocab(GetParam());
  for (const std::string& text : kStreamTexts) {
    const std::vector<int32_t> ids =
        tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
    for (const bool skip : {false, true}) {
      for (const bool continuation : {false, true}) {
        const std::vector<std::string> deltas =
            stream(tok, ids, {.skip_special = skip, .continuation = continuation});
        for (const std::string& d : deltas) EXPECT_TRUE(is_valid_utf8(d)) << escape(d);
        if (!continuation) {
          EXPECT_EQ(escape(concat(deltas)), escape(tok.decode(ids, skip))) << ids_to_string(ids);
        } else if (!tok.clean_spaces()) {
          // A continuation is the plain concatenation of the pieces (llama.cpp's streaming).
          std::string pieces;
          for (int32_t id : ids) pieces += tok.piece_view(id, !skip);
          EXPECT_EQ(escape(concat(deltas)), escape(sanitize_utf8(pieces))) << ids_to_string(ids);
        }
      }
    }
  }
}

TEST_P(IncrementalDetokenizerVocab, RandomTokenStreamsAddUpToDecode) {
  const Tokenizer& tok = vocab(GetParam());
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // Mostly byte tokens and short pieces, so partial and invalid UTF-8 is common.
  std::vector<int32_t> bytes;
  for (int b = 0x80; b < 0x100; ++b) {
    static const char kHex[] = "0123456789ABCDEF";
    const std::string spm_byte = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    if (auto id = tok.find_token(spm_byte)) bytes.push_back(*id);
  }
  std::uniform_int_distribution<int32_t> any(0, tok.n_vocab() - 1);
  for (int round = 0; round < 50; ++round) {
    std::vector<int32_t> ids(1 + rng() % 40);
    for (int32_t& id : ids)
      id = (!bytes.empty() && rng() % 2) ? bytes[rng() % bytes.size()] : any(rng);
    for (const bool skip : {false, true}) {
      const std::vector<std::string> deltas = stream(tok, ids, {.skip_special = skip});
      for (const std::string& d : deltas)
        ASSERT_TRUE(is_valid_utf8(d)) << escape(d) << " in " << ids_to_string(ids);
      ASSERT_EQ(escape(concat(deltas)), escape(tok.decode(ids, skip))) << ids_to_string(ids);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVocabs, IncrementalDetokenizerVocab, ::testing::ValuesIn(kAllVocabs),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

TEST(IncrementalDetokenizer, ResetsAfterFlush) {
  const Tokenizer& tok = vocab("llama-spm");
  const std::vector<int32_t> ids = tok.encode("Hello world", false, false);
  IncrementalDetokenizer detok(tok);
  for (int pass = 0; pass < 2; ++pass) {
    std::string text;
    for (int32_t id : ids) text += detok.feed(id);
    text += detok.flush();
    EXPECT_EQ(text, "Hello world");
  }
}

}  // namespace
}  // namespace vesper::tokenizer
