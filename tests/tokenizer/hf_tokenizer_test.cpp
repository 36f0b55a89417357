// The Hugging Face tokenizer loader (hf_tokenizer.h): checkpoint directories of
// ../shared/models/hf/ become tokenizer.ggml.* metadata, which is written to a GGUF with
// gguf::GgufWriter and built into a Tokenizer through Tokenizer::from_gguf, as a converted model
// would be. The ids must be Hugging Face's: llama.cpp's vectors (whose .out files Hugging Face
// made), the tiny-random-llama-2 reference corpus (transformers), and stories260K's own GGUF
// (checked against transformers.js and llama.cpp on the same text). Bad directories give errors
// naming the file and the field.
#include "tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "tokenizer/chat_template.h"
#include "tokenizer/synthetic_vocab.h"
#include "tokenizer/test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace vesper::tokenizer {
namespace {

using json = nlohmann::json;
using tok_test::escape;
using tok_test::ids_to_string;
using tok_test::Metadata;
using tok_test::read_cases;
using tok_test::read_expected;
using tok_test::read_file;

constexpr const char* kHfDir = "../shared/models/hf";
constexpr const char* kSp = "\xE2\x96\x81";  // U+2581
constexpr const char* kG = "\xC4\xA0";       // U+0120, the byte-level space

const gguf::Value* find_key(const Metadata& md, std::string_view key) {
  for (const auto& [k, v] : md)
    if (k == key) return &v;
  return nullptr;
}

std::optional<int64_t> key_int(const Metadata& md, std::string_view key) {
  const gguf::Value* v = find_key(md, key);
  return v ? v->as_int() : std::nullopt;
}

Metadata hf_metadata(const std::string& dir) {
  Result<Metadata> md = hf_tokenizer_metadata(dir);
  EXPECT_TRUE(md.ok()) << md.error().message;
  return md.ok() ? std::move(md).value() : Metadata{};
}

// The GGUF a converter would write from `md` (tokenizer keys only), opened as a Tokenizer.
Result<Tokenizer> tokenizer_from(const std::string& name, const Metadata& md) {
  return tok_test::load_tokenizer(tok_test::write_gguf("hf_" + name, md));
}

Result<Tokenizer> hf_tokenizer(const std::string& dir, const std::string& name) {
  Result<Metadata> md = hf_tokenizer_metadata(dir);
  if (!md.ok()) return md.error();
  return tokenizer_from(name, *md);
}

// Writes `files` (name -> content) into a fresh directory under the test temp dir.
std::string write_dir(const std::string& name, const std::map<std::string, std::string>& files) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("vesper_hf_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [file, content] : files) std::ofstream(dir / file, std::ios::binary) << content;
  return dir.string();
}

// A small SentencePiece-style tokenizer.json: <unk> <s> </s>, the byte tokens, then
// "▁" "a" "b" "▁a" "ab" "▁ab" "▁▁" with merges "▁ a", "a b", "▁a b", "▁ ▁".
json spm_tokenizer_json() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b)
    vocab[std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">"] = 3 + b;
  int next = 259;
  for (const std::string& piece :
       {std::string(kSp), std::string("a"), std::string("b"), kSp + std::string("a"),
        std::string("ab"), kSp + std::string("ab"), kSp + std::string(kSp)})
    vocab[piece] = next++;
  json added = json::array();
  const char* specials[] = {"<unk>", "<s>", "</s>"};
  for (int id = 0; id < 3; ++id)
    added.push_back({{"id", id}, {"content", specials[id]}, {"special", true}});
  return {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", kSp}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSp}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges",
         {kSp + std::string(" a"), "a b", kSp + std::string("a b"),
          kSp + std::string(" ") + kSp}}}},
  };
}

// A small byte-level tokenizer.json: the 256 byte-level characters, "Ġa" "ab" "Ġab", and
// <|endoftext|> (special), with merges "Ġ a", "a b", "Ġa b"; pre-tokenizer Split(`regex`) then
// ByteLevel.
json byte_level_tokenizer_json(const std::string& regex) {
  json vocab = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b)
    vocab[std::string(byte_to_bpe_char(static_cast<uint8_t>(b)))] = next++;
  for (const std::string& piece :
       {kG + std::string("a"), std::string("ab"), kG + std::string("ab")})
    vocab[piece] = next++;
  vocab["<|endoftext|>"] = next;
  return {
      {"added_tokens", {{{"id", next}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", regex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"ignore_merges", true},
        {"merges", {kG + std::string(" a"), "a b", kG + std::string("a b")}}}},
  };
}

// The regexes of the tokenizer.json files of Llama 3 and Qwen2, as Hugging Face ships them.
const std::string kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Expects hf_tokenizer_metadata(dir) to fail naming `file` and each of `needles`.
void expect_error(const std::string& dir, const std::string& file,
                  std::initializer_list<std::string> needles) {
  Result<Metadata> md = hf_tokenizer_metadata(dir);
  ASSERT_FALSE(md.ok()) << dir << " loaded, but should not have";
  const std::string& msg = md.error().message;
  EXPECT_NE(msg.find(dir + "/" + file + ":"), std::string::npos) << msg;
  for (const std::string& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
}

// --- real tokenizers against llama.cpp's vectors -------------------------------------------------

class HfLlama2Vectors : public ::testing::TestWithParam<std::string> {};

// Both spellings of merges ("a b" strings, [a, b] pairs) give Hugging Face's ids on all cases.
TEST_P(HfLlama2Vectors, EncodesEveryCaseLikeTheReference) {
  const std::string dir = std::string(kHfDir) + "/tokenizers/" + GetParam();
  const Metadata md = hf_metadata(dir);
  Result<Tokenizer> tok = tokenizer_from(GetParam(), md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->model(), "llama");
  EXPECT_EQ(tok->n_vocab(), 32000);
  // llama.cpp ignores merges for "llama" and merges by score: the scores derived from the merge
  // ranks must give the same ids there (Vesper without the merges key is that algorithm).
  Metadata scores_only = md;
  tok_test::remove_key(&scores_only, "tokenizer.ggml.merges");
  Result<Tokenizer> by_score = tokenizer_from(GetParam() + "_scores", scores_only);
  ASSERT_TRUE(by_score.ok()) << by_score.error().message;

  const std::string base = std::string(tok_test::kVectorsDir) + "/ggml-vocab-llama-spm.gguf";
  const std::vector<std::string> cases = read_cases(base + ".inp");
  const std::vector<std::vector<int32_t>> expected = read_expected(base + ".out");
  ASSERT_EQ(cases.size(), 46u);
  ASSERT_EQ(expected.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> got = tok->encode(cases[i], false, false);
    EXPECT_EQ(got, expected[i]) << "case " << i << " \"" << escape(cases[i]) << "\"\n  expected "
                                << ids_to_string(expected[i]) << "\n  got      "
                                << ids_to_string(got);
    const std::vector<int32_t> got_by_score = by_score->encode(cases[i], false, false);
    EXPECT_EQ(got_by_score, expected[i])
        << "by score, case " << i << " \"" << escape(cases[i]) << "\"";
  }
}

INSTANTIATE_TEST_SUITE_P(BothMergeForms, HfLlama2Vectors,
                         ::testing::Values("llama2-tinyllama", "llama2-pairs-merges"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The fixture is a CodeGen-style GPT-2 tokenizer.json: GPT-2's vocabulary and merges plus 38
// added (non-special) whitespace tokens, "  " to 31 spaces and two to nine tabs, which Hugging
// Face matches in the text before BPE. Cases without such runs must give the vectors' ids
// exactly; the others the vectors' ids of the text between the runs, with each run (leftmost,
// longest) as its added token.
TEST(HfTokenizer, Gpt2EncodesLikeTheVectorsPlusItsAddedWhitespaceTokens) {
  Result<Tokenizer> loaded = hf_tokenizer(std::string(kHfDir) + "/tokenizers/gpt2", "gpt2");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const Tokenizer& tok = *loaded;
  EXPECT_EQ(tok.model(), "gpt2");
  EXPECT_EQ(tok.pre(), "gpt-2");
  EXPECT_EQ(tok.n_vocab(), 50295);
  const std::string base = std::string(tok_test::kVectorsDir) + "/ggml-vocab-gpt-2.gguf";
  Result<Tokenizer> reference = tok_test::load_tokenizer(base);
  ASSERT_TRUE(reference.ok()) << reference.error().message;
  for (int32_t id = 0; id < reference->n_vocab(); ++id)
    ASSERT_EQ(tok.token_text(id), reference->token_text(id)) << "token " << id;

  std::vector<std::pair<std::string, int32_t>> added;
  for (int32_t id = reference->n_vocab(); id < tok.n_vocab(); ++id) {
    ASSERT_TRUE(tok.is_user_defined(id)) << id;
    added.emplace_back(std::string(tok.token_text(id)), id);
  }
  ASSERT_EQ(added.size(), 38u);
  const auto hf_expected = [&](const std::string& text, const std::vector<int32_t>& plain) {
    std::vector<int32_t> out;
    size_t begin = 0;
    bool matched = false;
    for (size_t pos = 0; pos < text.size();) {
      size_t best = 0;
      int32_t best_id = -1;
      for (const auto& [piece, id] : added) {
        if (piece.size() > best && text.compare(pos, piece.size(), piece) == 0) {
          best = piece.size();
          best_id = id;
        }
      }
      if (best == 0) {
        ++pos;
        continue;
      }
      matched = true;
      const std::vector<int32_t> gap =
          reference->encode(text.substr(begin, pos - begin), false, false);
      out.insert(out.end(), gap.begin(), gap.end());
      out.push_back(best_id);
      pos += best;
      begin = pos;
    }
    if (!matched) return plain;
    const std::vector<int32_t> tail = reference->encode(text.substr(begin), false, false);
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  };

  const std::vector<std::string> cases = read_cases(base + ".inp");
  const std::vector<std::vector<int32_t>> expected = read_expected(base + ".out");
  ASSERT_EQ(cases.size(), 46u);
  ASSERT_EQ(expected.size(), cases.size());
  int plain_cases = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::vector<int32_t> want = hf_expected(cases[i], expected[i]);
    if (want == expected[i]) ++plain_cases;
    const std::vector<int32_t> got = tok.encode(cases[i], false, false);
    EXPECT_EQ(got, want) << "case " << i << " \"" << escape(cases[i]) << "\"\n  expected "
                         << ids_to_string(want) << "\n  got      " << ids_to_string(got);
  }
  EXPECT_EQ(plain_cases, 39);  // the other 7 hold runs of spaces or tabs
}

// A vocabulary without merges: Hugging Face never merges, so every character that is not
// itself a token is spelled with byte tokens (llama.cpp's score merging would differ).
TEST(HfTokenizer, TinyRandomLlama2MatchesTheTransformersReferenceCorpus) {
  const std::string dir = std::string(kHfDir) + "/stas-tiny-random-llama-2";
  Result<Tokenizer> loaded = hf_tokenizer(dir, "stas_tiny");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const Tokenizer& tok = *loaded;
  EXPECT_EQ(tok.n_vocab(), 3000);
  const json corpus = json::parse(read_file(dir + "/lunaflux_reference_corpus.json"));
  ASSERT_TRUE(corpus.contains("tokenizer_cases"));
  ASSERT_EQ(corpus["tokenizer_cases"].size(), 5u);
  for (const json& c : corpus["tokenizer_cases"]) {
    const std::string text = c["text"].get<std::string>();
    const bool add_special = c["add_special_tokens"].get<bool>();
    const std::vector<int32_t> want = c["token_ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text, add_special, /*parse_special=*/true);
    EXPECT_EQ(got, want) << "\"" << escape(text) << "\"\n  expected " << ids_to_string(want)
                         << "\n  got      " << ids_to_string(got);
  }
}

// stories260K's tokenizer.json (made from the GGUF's pieces and scores) tokenizes and detokenizes
// like the GGUF itself on the held-out TinyStories text and on edge cases.
TEST(HfTokenizer, Stories260KEncodesAndDecodesLikeItsGguf) {
  Result<Tokenizer> loaded = hf_tokenizer(std::string(kHfDir) + "/stories260K", "stories260K");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const Tokenizer& tok = *loaded;
  Result<Tokenizer> gguf =
      tok_test::load_tokenizer(std::string(tok_test::kModelsDir) + "/stories260K.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  ASSERT_EQ(tok.n_vocab(), gguf->n_vocab());
  EXPECT_EQ(tok.bos_id(), gguf->bos_id());
  EXPECT_EQ(tok.eos_id(), gguf->eos_id());
  EXPECT_EQ(tok.unk_id(), gguf->unk_id());
  EXPECT_EQ(tok.add_bos(), gguf->add_bos());
  EXPECT_EQ(tok.add_eos(), gguf->add_eos());
  EXPECT_EQ(tok.add_space_prefix(), gguf->add_space_prefix());
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    ASSERT_EQ(tok.token_text(id), gguf->token_text(id)) << id;
    ASSERT_EQ(tok.token_attr(id), gguf->token_attr(id)) << id;
  }

  std::vector<std::string> texts;
  std::istringstream lines(read_file("../shared/data/tinystories-heldout.txt"));
  for (std::string line; std::getline(lines, line);) texts.push_back(line);
  ASSERT_EQ(texts.size(), 513u);
  for (const char* edge : {"",
                           " ",
                           "  ",
                           "   x",
                           "Hello",
                           " Hello",
                           "trailing  ",
                           "a\nb",
                           "a\r\nb",
                           "\t tab",
                           "12345 678",
                           "don't stop!",
                           "\xC3\xA9t\xC3\xA9",
                           "e\xCC\x81",
                           "\xE6\x97\xA5\xE6\x9C\xAC",
                           "\xF0\x9F\xA6\x99",
                           "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
                           "\xEF\xBB\xBF"
                           "bom",
                           "hair\xE2\x80\x8Aspace",
                           "\xE2\x96\x81literal",
                           "<s>Once",
                           "end</s>",
                           "<unk>",
                           "Lily and Tom went to the park."})
    texts.emplace_back(edge);
  texts.emplace_back(std::string("nul\0byte", 8));

  int checked = 0;
  for (const std::string& text : texts) {
    for (bool parse_special : {false, true}) {
      const std::vector<int32_t> want = gguf->encode(text, true, parse_special);
      const std::vector<int32_t> got = tok.encode(text, true, parse_special);
      ASSERT_EQ(got, want) << "\"" << escape(text) << "\" parse_special " << parse_special
                           << "\n  expected " << ids_to_string(want) << "\n  got      "
                           << ids_to_string(got);
      for (bool skip_special : {false, true})
        ASSERT_EQ(tok.decode(got, skip_special), gguf->decode(want, skip_special)) << escape(text);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 538);
  // The known pair from the fixture's README.
  EXPECT_EQ(tok.encode("Once upon a time", true, false),
            (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

// --- metadata details
// -------------------------------------------------------------------------------

TEST(HfTokenizer, Llama2CarriesItsChatTemplateAndSpecialTokens) {
  const std::string dir = std::string(kHfDir) + "/tokenizers/llama2-tinyllama";
  const Metadata md = hf_metadata(dir);
  const json config = json::parse(read_file(dir + "/tokenizer_config.json"));
  const gguf::Value* chat = find_key(md, "tokenizer.chat_template");
  ASSERT_NE(chat, nullptr);
  ASSERT_NE(chat->as_string(), nullptr);
  EXPECT_EQ(*chat->as_string(), config["chat_template"].get<std::string>());
  EXPECT_EQ(key_int(md, "tokenizer.ggml.padding_token_id"), 2);  // pad_token "</s>"

  const std::string path = tok_test::write_gguf("hf_llama2_chat", md);
  Result<gguf::GgufFile> file = gguf::GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  Result<ModelChatTemplate> chosen = model_chat_template(*file);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_EQ(chosen->source, config["chat_template"].get<std::string>());

  Result<Tokenizer> tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->unk_id(), 0);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_TRUE(tok->add_space_prefix());
  EXPECT_TRUE(tok->is_unknown(0));
  EXPECT_TRUE(tok->is_control(1));
  EXPECT_TRUE(tok->is_byte(3 + 0x41));
  EXPECT_EQ(tok->eog_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tok->encode("Hello world", true, false), (std::vector<int32_t>{1, 15043, 3186}));
  // Merge scores: minus the rank of the first merge that makes the piece.
  EXPECT_EQ(tok->token_score(*tok->find_token("\xE2\x96\x81t")), 0.0f);  // merge 0 is "▁ t"
  EXPECT_EQ(tok->token_score(*tok->find_token("er")), -1.0f);
}

// A list of named templates: "default" is tokenizer.chat_template, the others
// tokenizer.chat_template.<name> (as convert_hf_to_gguf.py writes them). Newer checkpoints keep
// the template in chat_template.jinja instead.
TEST(HfTokenizer, ChatTemplatesFromAListOrAJinjaFile) {
  const json config = {{"chat_template",
                        {{{"name", "default"}, {"template", "{{ messages }}"}},
                         {{"name", "tool_use"}, {"template", "{{ tools }}"}}}}};
  const std::string dir = write_dir("chat_list", {{"tokenizer.json", spm_tokenizer_json().dump()},
                                                  {"tokenizer_config.json", config.dump()}});
  const Metadata md = hf_metadata(dir);
  ASSERT_NE(find_key(md, "tokenizer.chat_template"), nullptr);
  EXPECT_EQ(*find_key(md, "tokenizer.chat_template")->as_string(), "{{ messages }}");
  ASSERT_NE(find_key(md, "tokenizer.chat_template.tool_use"), nullptr);
  EXPECT_EQ(*find_key(md, "tokenizer.chat_template.tool_use")->as_string(), "{{ tools }}");

  const std::string jinja =
      write_dir("chat_jinja", {{"tokenizer.json", spm_tokenizer_json().dump()},
                               {"chat_template.jinja", "{{ bos_token }}"}});
  const Metadata from_file = hf_metadata(jinja);
  ASSERT_NE(find_key(from_file, "tokenizer.chat_template"), nullptr);
  EXPECT_EQ(*find_key(from_file, "tokenizer.chat_template")->as_string(), "{{ bos_token }}");
}

// Without add_bos_token in tokenizer_config.json, the TemplateProcessing post-processor decides.
TEST(HfTokenizer, AddBosFollowsThePostProcessorWhenTheConfigIsSilent) {
  json t = spm_tokenizer_json();
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                           {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"special_tokens",
                          {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                           {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  const std::string dir = write_dir("template", {{"tokenizer.json", t.dump()}});
  Result<Tokenizer> tok = tokenizer_from("template", hf_metadata(dir));
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_TRUE(tok->add_bos());
  EXPECT_TRUE(tok->add_eos());
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  // "▁ a b": "▁ a" (rank 0) first, then "▁a b" (rank 2).
  EXPECT_EQ(tok->encode("ab", true, false),
            (std::vector<int32_t>{1, *tok->find_token(kSp + std::string("ab")), 2}));

  const std::string silent =
      write_dir("no_template", {{"tokenizer.json", spm_tokenizer_json().dump()}});
  Result<Tokenizer> plain = tokenizer_from("no_template", hf_metadata(silent));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_FALSE(plain->add_bos());  // Hugging Face adds nothing without a template
  EXPECT_FALSE(plain->add_eos());
}

// Merges decide, not scores: "a b" is listed after "▁ a", so in "▁ab" HF forms "▁a" first.
// Without the "▁a b" merge, "▁ab" can never form even though it is a token.
TEST(HfTokenizer, SentencePieceStyleMergesOnlyListedPairsByRank) {
  json t = spm_tokenizer_json();
  t["model"]["merges"] = {"a b", kSp + std::string(" a")};
  const std::string dir = write_dir("rank_order", {{"tokenizer.json", t.dump()}});
  Result<Tokenizer> tok = tokenizer_from("rank_order", hf_metadata(dir));
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  // "▁ a b": rank 0 is "a b" -> "▁" "ab"; "▁ ab" is not listed, so it stays two tokens.
  EXPECT_EQ(tok->encode("ab", false, false),
            (std::vector<int32_t>{*tok->find_token(kSp), *tok->find_token("ab")}));
  // "▁ a" (rank 1) applies where "a b" does not.
  EXPECT_EQ(tok->encode("a", false, false),
            (std::vector<int32_t>{*tok->find_token(kSp + std::string("a"))}));
}

// Metaspace with split cuts before every "▁", so "▁ ▁" can never merge: its merge is dropped.
TEST(HfTokenizer, MetaspaceSplitDropsMergesAcrossSpaces) {
  json t = spm_tokenizer_json();
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", kSp}, {"prepend_scheme", "always"}, {"split", true}};
  const std::string dir = write_dir("metaspace_split", {{"tokenizer.json", t.dump()}});
  const Metadata md = hf_metadata(dir);
  const gguf::Value* merges = find_key(md, "tokenizer.ggml.merges");
  ASSERT_NE(merges, nullptr);
  EXPECT_EQ(merges->as_array()->items.size(), 3u);
  Result<Tokenizer> tok = tokenizer_from("metaspace_split", md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_TRUE(tok->add_space_prefix());
  // "▁a▁▁b" is cut into "▁a" "▁" "▁b"; "▁b" is no token and "▁ b" no merge.
  const int32_t sp = *tok->find_token(kSp);
  EXPECT_EQ(tok->encode("a  b", false, false),
            (std::vector<int32_t>{*tok->find_token(kSp + std::string("a")), sp, sp,
                                  *tok->find_token("b")}));

  t["pre_tokenizer"]["split"] = false;
  t["pre_tokenizer"]["prepend_scheme"] = "never";
  const std::string dir2 = write_dir("metaspace_nosplit", {{"tokenizer.json", t.dump()}});
  Result<Tokenizer> joined = tokenizer_from("metaspace_nosplit", hf_metadata(dir2));
  ASSERT_TRUE(joined.ok()) << joined.error().message;
  EXPECT_FALSE(joined->add_space_prefix());
  EXPECT_EQ(
      joined->encode("a  b", false, false),
      (std::vector<int32_t>{*joined->find_token("a"), *joined->find_token(kSp + std::string(kSp)),
                            *joined->find_token("b")}));
}

TEST(HfTokenizer, ByteLevelRegexesPickTheirPreset) {
  const std::pair<std::string, std::string> cases[] = {{kLlama3Regex, "llama-bpe"},
                                                       {kQwen2Regex, "qwen2"}};
  for (const auto& [regex, pre] : cases) {
    json t = byte_level_tokenizer_json(regex);
    json config = {{"clean_up_tokenization_spaces", pre == "llama-bpe"}};
    if (pre == "qwen2") t["model"]["ignore_merges"] = false;
    const std::string dir = write_dir(
        "pre_" + pre, {{"tokenizer.json", t.dump()}, {"tokenizer_config.json", config.dump()}});
    Result<Tokenizer> tok = tokenizer_from("pre_" + pre, hf_metadata(dir));
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    EXPECT_EQ(tok->pre(), pre);
    EXPECT_EQ(tok->type(), VocabType::kBpe);
    const int32_t space_ab = *tok->find_token(kG + std::string("ab"));
    EXPECT_EQ(tok->encode(" ab ab", false, false), (std::vector<int32_t>{space_ab, space_ab}));
  }
}

// generation_config.json's list of EOS ids: the first is EOS, and all end generation. Those
// llama.cpp would not know by text take the EOT and EOM slots.
TEST(HfTokenizer, GenerationConfigEosListEndsGenerationOnEveryId) {
  json t = byte_level_tokenizer_json(kLlama3Regex);
  const int32_t eot = t["model"]["vocab"]["<|endoftext|>"].get<int32_t>();
  const int32_t ab = t["model"]["vocab"]["ab"].get<int32_t>();
  const int32_t space_ab = t["model"]["vocab"][kG + std::string("ab")].get<int32_t>();
  const int32_t a = t["model"]["vocab"]["a"].get<int32_t>();
  const std::string dir = write_dir(
      "eog", {{"tokenizer.json", t.dump()},
              {"generation_config.json", json({{"eos_token_id", {eot, ab, space_ab, a}}}).dump()}});
  const Metadata md = hf_metadata(dir);
  EXPECT_EQ(key_int(md, "tokenizer.ggml.eos_token_id"), eot);
  EXPECT_EQ(key_int(md, "tokenizer.ggml.eot_token_id"), ab);
  EXPECT_EQ(key_int(md, "tokenizer.ggml.eom_token_id"), space_ab);
  Result<Tokenizer> tok = tokenizer_from("eog", md);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  for (int32_t id : {eot, ab, space_ab, a}) EXPECT_TRUE(tok->is_eog(id)) << id;
  EXPECT_FALSE(tok->is_eog(*tok->find_token("b")));
}

// None of the llama.cpp-converted "llama" vocabularies carries merges, so they keep llama.cpp's
// score order (the merge-rank mode is only for metadata from tokenizer.json).
TEST(HfTokenizer, VectorsLlamaVocabsCarryNoMerges) {
  int llama_vocabs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tok_test::kVectorsDir)) {
    if (entry.path().extension() != ".gguf") continue;
    Result<gguf::GgufFile> file = gguf::GgufFile::open(entry.path().string());
    ASSERT_TRUE(file.ok()) << file.error().message;
    const gguf::Value* model = file->find("tokenizer.ggml.model");
    if (model == nullptr || model->as_string() == nullptr || *model->as_string() != "llama")
      continue;
    ++llama_vocabs;
    EXPECT_EQ(file->find("tokenizer.ggml.merges"), nullptr) << entry.path();
  }
  EXPECT_EQ(llama_vocabs, 2);  // llama-spm, phi-3
}

// --- errors
// ---------------------------------------------------------------------------------------

TEST(HfTokenizerErrors, MissingTokenizerJson) {
  const std::string dir = write_dir("missing", {{"config.json", "{}"}});
  expect_error(dir, "tokenizer.json", {"not found"});
}

TEST(HfTokenizerErrors, InvalidJson) {
  const std::string dir =
      write_dir("invalid", {{"tokenizer.json", "{\"model\": {\"type\": \"BPE\",,}"}});
  expect_error(dir, "tokenizer.json", {"invalid JSON"});
  const std::string config = write_dir(
      "invalid_config",
      {{"tokenizer.json", spm_tokenizer_json().dump()}, {"tokenizer_config.json", "[1, 2"}});
  expect_error(config, "tokenizer_config.json", {"invalid JSON"});
}

TEST(HfTokenizerErrors, UnsupportedModelType) {
  json t = spm_tokenizer_json();
  t["model"]["type"] = "Unigram";
  expect_error(write_dir("unigram", {{"tokenizer.json", t.dump()}}), "tokenizer.json",
               {"model.type", "\"Unigram\"", "BPE"});
  t["model"]["type"] = "WordPiece";
  expect_error(write_dir("wordpiece", {{"tokenizer.json", t.dump()}}), "tokenizer.json",
               {"model.type", "\"WordPiece\""});
}

TEST(HfTokenizerErrors, UnsupportedNormalizerOrPreTokenizer) {
  json t = spm_tokenizer_json();
  t["normalizer"]["normalizers"].push_back({{"type", "NFKC"}});
  expect_error(write_dir("nfkc", {{"tokenizer.json", t.dump()}}), "tokenizer.json",
               {"normalizer.normalizers[2].type", "\"NFKC\""});
  json w = spm_tokenizer_json();
  w["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(write_dir("whitespace", {{"tokenizer.json", w.dump()}}), "tokenizer.json",
               {"pre_tokenizer.type", "\"Whitespace\""});
  json nofallback = spm_tokenizer_json();
  nofallback["model"]["byte_fallback"] = false;
  expect_error(write_dir("nofallback", {{"tokenizer.json", nofallback.dump()}}), "tokenizer.json",
               {"model.byte_fallback"});
}

TEST(HfTokenizerErrors, UnknownPreTokenizerRegex) {
  const std::string regex = R"(\p{L}+|\p{N}{1,7}|\s+)";
  const std::string dir =
      write_dir("regex", {{"tokenizer.json", byte_level_tokenizer_json(regex).dump()}});
  expect_error(dir, "tokenizer.json",
               {"pre_tokenizer.pretokenizers[0].pattern.Regex", "\"" + regex + "\""});
}

TEST(HfTokenizerErrors, MergeNamingAnUnknownPiece) {
  json t = spm_tokenizer_json();
  t["model"]["merges"].push_back("a zz");
  expect_error(write_dir("merge_piece", {{"tokenizer.json", t.dump()}}), "tokenizer.json",
               {"model.merges[4]", "\"zz\"", "not in model.vocab"});
  json pairs = spm_tokenizer_json();
  pairs["model"]["merges"] = json::array({json::array({"b", "a"})});
  expect_error(write_dir("merge_result", {{"tokenizer.json", pairs.dump()}}), "tokenizer.json",
               {"model.merges[0]", "\"ba\"", "not in model.vocab"});
  json bad = spm_tokenizer_json();
  bad["model"]["merges"] = {"a b c"};
  expect_error(write_dir("merge_form", {{"tokenizer.json", bad.dump()}}), "tokenizer.json",
               {"model.merges[0]", "one space"});
}

TEST(HfTokenizerErrors, SpecialTokenOrIdOutsideTheVocabulary) {
  const std::string dir =
      write_dir("bad_bos", {{"tokenizer.json", spm_tokenizer_json().dump()},
                            {"tokenizer_config.json", R"({"bos_token": {"content": "<bos>"}})"}});
  expect_error(dir, "tokenizer_config.json", {"bos_token", "\"<bos>\""});
  const std::string gen =
      write_dir("bad_eos", {{"tokenizer.json", spm_tokenizer_json().dump()},
                            {"generation_config.json", R"({"eos_token_id": [2, 99999]})"}});
  expect_error(gen, "generation_config.json", {"eos_token_id", "99999"});
}

TEST(HfTokenizerErrors, DuplicateIds) {
  json t = spm_tokenizer_json();
  t["added_tokens"].push_back({{"id", 259}, {"content", "<extra>"}, {"special", true}});
  expect_error(write_dir("dup_id", {{"tokenizer.json", t.dump()}}), "tokenizer.json",
               {"added_tokens[3]", "id 259", "\"<extra>\""});
}

}  // namespace
}  // namespace vesper::tokenizer
