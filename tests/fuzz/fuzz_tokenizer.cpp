// Fuzz target: the tokenizers of real vocabularies (SPM, byte-level BPE with several
// pre-tokenizers, WordPiece) on fuzzed text and fuzzed token ids, checked against the promises
// of tokenizer/tokenizer.h and tokenizer/incremental_detokenizer.h:
//  - encode gives ids in [0, n_vocab()), BOS/EOS where add_special asks, nothing for "";
//  - decoded text is valid UTF-8, and equals an independent reference built from
//    piece_view() (drop rules, first-token space rule, clean-up, U+FFFD repair);
//  - decode(encode(x)) == x for SPM and BPE when x is valid UTF-8, has no pattern the space
//    clean-up removes, no added-token text, only bytes the vocabulary can spell and (SPM) no
//    U+2581;
//  - IncrementalDetokenizer: every delta is valid UTF-8, the deltas plus flush() equal decode()
//    (and, with `continuation`, decode without the first-token space rule), and a reset
//    detokenizer gives the same text again;
//  - token_to_piece == piece_view; find_token(token_text(id)) == id; byte tokens are one byte;
//    control tokens render as nothing unless asked.
//
// Input layout (FuzzedDataProvider): the last byte picks the vocabulary, the one before it
// holds the flags and the mode; the rest is the text (mode encode) or the token ids.
#include <fuzzer/FuzzedDataProvider.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "fuzz_util.h"
#include "gguf/gguf.h"
#include "tokenizer/detokenize.h"
#include "tokenizer/incremental_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

// A fixed order, so that a reproducer keeps picking the same vocabulary.
constexpr const char* kVocabFiles[] = {
    "../shared/models/stories260K.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-gpt-2.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-bert-bge.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-llama-spm.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-phi-3.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-deepseek-coder.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-deepseek-llm.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-falcon.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-mpt.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-refact.gguf",
    "../shared/tokenizer-vectors/ggml-vocab-starcoder.gguf",
};

constexpr size_t kMaxIds = 4096;

std::vector<Tokenizer> load_tokenizers() {
  std::vector<Tokenizer> out;
  for (const char* relative : kVocabFiles) {
    const std::string path = fuzz::repo_path(relative);
    auto file = gguf::GgufFile::open(path);
    VESPER_CHECK(file.ok(), "%s", file.error().message.c_str());
    auto tok = Tokenizer::from_gguf(*file);
    VESPER_CHECK(tok.ok(), "%s", tok.error().message.c_str());
    out.push_back(std::move(tok).value());
  }
  return out;
}

// Texts of tokens that encode() matches whole even without parse_special.
std::vector<std::string> user_defined_texts(const Tokenizer& tok) {
  std::vector<std::string> texts;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_user_defined(id)) texts.emplace_back(tok.token_text(id));
  return texts;
}

// Which bytes the vocabulary can spell: SPM through byte-fallback tokens <0xXX>, BPE through
// its byte-level characters. Some vocabularies lack a few (falcon has no token for 0x03, for
// instance); encode() then drops that byte, as llama.cpp does, or gives <unk>.
std::array<bool, 256> spellable_bytes(const Tokenizer& tok) {
  std::array<bool, 256> spellable{};
  for (int b = 0; b < 256; ++b) {
    if (tok.type() == VocabType::kBpe) {
      spellable[b] = tok.find_token(byte_to_bpe_char(static_cast<uint8_t>(b))).has_value();
    } else {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      spellable[b] = tok.find_token(name).has_value();
    }
  }
  return spellable;
}

struct Vocabulary {
  Tokenizer tok;
  std::vector<std::string> user_defined;
  std::array<bool, 256> spellable;
};

const std::vector<Vocabulary>& vocabularies() {
  static const std::vector<Vocabulary> all = [] {
    std::vector<Vocabulary> v;
    for (Tokenizer& t : load_tokenizers()) {
      std::vector<std::string> texts = user_defined_texts(t);
      const std::array<bool, 256> spellable = spellable_bytes(t);
      v.push_back({std::move(t), std::move(texts), spellable});
    }
    return v;
  }();
  return all;
}

// decode() rebuilt from its documented parts: drop a leading BOS and a trailing EOS the
// vocabulary adds (skip_special), strip the first token's leading space (SPM's space prefix,
// not after a dropped BOS; not with `continuation`), join the pieces, clean up spaces, repair.
std::string reference_decode(const Tokenizer& tok, const std::vector<int32_t>& ids,
                             bool skip_special, bool continuation) {
  size_t first = 0;
  size_t last = ids.size();
  bool strip_space = tok.add_space_prefix() && !continuation;
  if (skip_special && tok.add_bos() && last > first && ids[first] == tok.bos_id()) {
    strip_space = false;
    ++first;
  }
  if (skip_special && tok.add_eos() && last > first && ids[last - 1] == tok.eos_id()) --last;
  std::string raw;
  for (size_t i = first; i < last; ++i) {
    std::string_view piece = tok.piece_view(ids[i], !skip_special);
    if (i == first && strip_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    raw.append(piece);
  }
  if (tok.clean_spaces()) raw = clean_up_spaces(raw);
  return sanitize_utf8(raw);
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

// Streams `ids` through an IncrementalDetokenizer; checks every delta and returns the text.
std::string stream(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    const std::string_view delta = detok.feed(id);
    VESPER_CHECK(is_valid_utf8(delta), "delta after id %d is not valid UTF-8: %s", id,
                 printable(delta).c_str());
    text.append(delta);
  }
  const std::string_view rest = detok.flush();
  VESPER_CHECK(is_valid_utf8(rest), "flush() is not valid UTF-8: %s", printable(rest).c_str());
  text.append(rest);
  return text;
}

void check_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  const std::string text = tok.decode(ids, skip_special);
  VESPER_CHECK(is_valid_utf8(text), "decode is not valid UTF-8: %s", printable(text).c_str());
  const std::string expected = reference_decode(tok, ids, skip_special, false);
  VESPER_CHECK(text == expected, "%s: decode gives \"%s\", its parts give \"%s\"",
               tok.path().c_str(), printable(text).c_str(), printable(expected).c_str());

  IncrementalDetokenizer detok(tok, {.skip_special = skip_special, .continuation = false});
  const std::string streamed = stream(detok, ids);
  VESPER_CHECK(streamed == text, "%s: streamed \"%s\" != decoded \"%s\"", tok.path().c_str(),
               printable(streamed).c_str(), printable(text).c_str());
  // flush() reset it: the same ids give the same text again.
  VESPER_CHECK(stream(detok, ids) == text, "a flushed detokenizer streams differently");

  IncrementalDetokenizer cont(tok, {.skip_special = skip_special, .continuation = true});
  const std::string continued = stream(cont, ids);
  const std::string expected_continued = reference_decode(tok, ids, skip_special, true);
  VESPER_CHECK(continued == expected_continued, "%s: continuation streamed \"%s\", expected \"%s\"",
               tok.path().c_str(), printable(continued).c_str(),
               printable(expected_continued).c_str());
}

bool has_clean_up_pattern(std::string_view text) {
  for (std::string_view p : {" ?", " !", " .", " ,", " '"})
    if (text.find(p) != std::string_view::npos) return true;
  return false;
}

void check_encode(const Vocabulary& vocab, std::string_view text, bool add_special,
                  bool parse_special) {
  const Tokenizer& tok = vocab.tok;
  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids) VESPER_CHECK(tok.is_valid(id), "encode gave id %d", id);
  if (!add_special && text.empty()) VESPER_CHECK(ids.empty(), "\"\" gave %zu ids", ids.size());
  if (add_special && tok.add_bos() && tok.type() != VocabType::kWpm)
    VESPER_CHECK(!ids.empty() && ids.front() == tok.bos_id(), "no BOS at the start");
  if (add_special && tok.add_eos() && tok.type() != VocabType::kWpm)
    VESPER_CHECK(!ids.empty() && ids.back() == tok.eos_id(), "no EOS at the end");

  check_decode(tok, ids, false);
  check_decode(tok, ids, true);

  if (add_special || parse_special || tok.type() == VocabType::kWpm) return;
  if (!is_valid_utf8(text) || (tok.clean_spaces() && has_clean_up_pattern(text))) return;
  for (const std::string& t : vocab.user_defined)
    if (text.find(t) != std::string_view::npos) return;
  for (unsigned char c : text)
    if (!vocab.spellable[c]) return;
  // SPM spells spaces as U+2581, so a U+2581 in the text decodes as a space.
  if (tok.type() == VocabType::kSpm && text.find("\xE2\x96\x81") != std::string_view::npos) return;
  const std::string decoded = tok.decode(ids, false);
  VESPER_CHECK(decoded == text, "%s: decode(encode(\"%s\")) = \"%s\"", tok.path().c_str(),
               printable(text).c_str(), printable(decoded).c_str());
}

void check_pieces(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    for (bool render : {false, true}) {
      const std::string piece = tok.token_to_piece(id, render);
      VESPER_CHECK(piece == tok.piece_view(id, render));
    }
    VESPER_CHECK(tok.find_token(tok.token_text(id)) == id, "find_token(token_text(%d))", id);
    const uint32_t attr = tok.token_attr(id);
    if (attr & kAttrByte)
      VESPER_CHECK(tok.piece_view(id, true).size() == 1, "byte token %d is not one byte", id);
    if ((attr & (kAttrControl | kAttrUnknown)) && !(attr & kAttrUserDefined))
      VESPER_CHECK(tok.piece_view(id, false).empty(), "control token %d renders unasked", id);
    (void)tok.is_eog(id);
    (void)tok.token_score(id);
  }
}

}  // namespace
}  // namespace vesper::tokenizer

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace vesper::tokenizer;
  const auto& all = vocabularies();
  FuzzedDataProvider fdp(data, size);
  const Vocabulary& vocab = all[fdp.ConsumeIntegralInRange<size_t>(0, all.size() - 1)];
  const Tokenizer& tok = vocab.tok;
  const uint8_t flags = fdp.ConsumeIntegral<uint8_t>();
  const bool add_special = (flags & 1) != 0;
  const bool parse_special = (flags & 2) != 0;
  const bool skip_special = (flags & 4) != 0;
  switch ((flags >> 4) % 3) {
    case 0: {
      const std::string text = fdp.ConsumeRemainingBytesAsString();
      check_encode(vocab, text, add_special, parse_special);
      break;
    }
    default: {
      std::vector<int32_t> ids;
      while (fdp.remaining_bytes() > 0 && ids.size() < kMaxIds)
        ids.push_back(fdp.ConsumeIntegralInRange<int32_t>(0, tok.n_vocab() - 1));
      if ((flags >> 4) % 3 == 1) {
        check_decode(tok, ids, skip_special);
      } else {
        check_pieces(tok, ids);
      }
      break;
    }
  }
  return 0;
}
