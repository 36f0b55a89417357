#include "tokenizer/wpm.h"

#include <algorithm>
#include <string>

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

// BERT's BasicTokenizer as llama.cpp does it: words split at whitespace, and punctuation,
// ASCII symbols and CJK ideographs each as a word of their own.
std::vector<std::string> split_words(const Vocab& vocab, std::string_view text) {
  std::vector<std::string> words(1);
  for (uint32_t cpt : decode_utf8_lenient(text)) {
    if (vocab.strip_accents) cpt = nfd_base(cpt);
    const uint8_t flags = codepoint_flags(cpt);
    if (flags & kCpWhitespace) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    if (cpt == 0 || cpt == kReplacementCodepoint || (flags & kCpControl)) continue;
    if (vocab.strip_accents && (flags & kCpMark)) continue;
    const uint32_t mapped = vocab.lowercase ? to_lower(cpt) : cpt;
    if ((flags & kCpPunctuation) || (cpt < 0x7F && (flags & kCpSymbol)) || is_bert_chinese_char(cpt)) {
      if (!words.back().empty()) words.emplace_back();
      append_utf8(mapped, &words.back());
      words.emplace_back();
    } else {
      append_utf8(mapped, &words.back());
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

}  // namespace

void wpm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out) {
  std::string word;
  for (const std::string& w : split_words(vocab, text)) {
    word = "\xE2\x96\x81" + w;  // word-initial pieces carry the SentencePiece space
    const size_t n = word.size();
    const size_t first_token = out->size();
    for (size_t i = 0; i < n;) {
      bool matched = false;
      for (size_t j = std::min(n, i + vocab.max_token_len + 1); j > i; --j) {
        const int32_t id = vocab.find(std::string_view(word).substr(i, j - i));
        if (id != kNoToken) {
          out->push_back(id);
          matched = true;
          i = j;
          break;
        }
      }
      if (!matched) {  // the word cannot be spelled: drop its pieces
        out->resize(first_token);
        break;
      }
    }
    if (out->size() == first_token && vocab.unk != kNoToken) out->push_back(vocab.unk);
  }
}

}  // namespace vesper::tokenizer
