#include "tokenizer/encode.h"

#include <cctype>
#include <string>

#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/wpm.h"

namespace vesper::tokenizer {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Splits every text fragment of `in` at the occurrences of one special token.
void split_on_token(const Vocab& vocab, std::string_view text, int32_t id,
                    const std::vector<Fragment>& in, std::vector<Fragment>* out) {
  const std::string& needle = vocab.tokens[id].text;
  const uint32_t attr = vocab.tokens[id].attr;
  for (const Fragment& f : in) {
    if (f.token != kNoToken) {
      out->push_back(f);
      continue;
    }
    size_t begin = f.begin;
    const size_t end = f.end;
    while (begin < end) {
      const size_t hit = text.substr(0, end).find(needle, begin);
      if (hit == std::string_view::npos) break;
      size_t left_end = hit;
      if (attr & kAttrLstrip)
        while (left_end > begin && is_space(text[left_end - 1])) --left_end;
      if (left_end > begin) out->push_back({kNoToken, begin, left_end});
      out->push_back({id, 0, 0});
      begin = hit + needle.size();
      if (attr & kAttrRstrip)
        while (begin < end && is_space(text[begin])) ++begin;
    }
    if (begin < end) out->push_back({kNoToken, begin, end});
  }
}

std::string escape_spaces(std::string_view text, bool add_prefix) {
  std::string out;
  out.reserve(text.size() + text.size() / 2 + 3);
  if (add_prefix) out += "\xE2\x96\x81";
  for (char c : text) {
    if (c == ' ') {
      out += "\xE2\x96\x81";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text, bool parse_special) {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, 0, text.size()});

  // Only tokens that occur somewhere in the text can split it: find them in one pass.
  std::vector<char> occurs(vocab.special_tokens.size(), 0);
  bool any = false;
  vocab.special_trie.for_each_occurring(text, [&](int32_t index) {
    occurs[index] = 1;
    any = true;
  });
  if (!any) return fragments;

  std::vector<Fragment> next;
  for (size_t i = 0; i < vocab.special_tokens.size(); ++i) {  // longest text first
    if (!occurs[i]) continue;
    const int32_t id = vocab.special_tokens[i];
    if (!parse_special && (vocab.tokens[id].attr & (kAttrControl | kAttrUnknown))) continue;
    next.clear();
    split_on_token(vocab, text, id, fragments, &next);
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> encode_text(const Vocab& vocab, std::string_view text, bool add_special,
                                 bool parse_special) {
  std::vector<int32_t> out;
  const std::vector<Fragment> fragments = partition_special(vocab, text, parse_special);
  const auto fragment_text = [&](const Fragment& f) { return text.substr(f.begin, f.end - f.begin); };

  switch (vocab.type) {
    case VocabType::kSpm: {
      if (add_special && vocab.add_bos) out.push_back(vocab.bos);
      // The space prefix goes before the first text and before text that follows a special
      // token, as in llama.cpp.
      bool prev_special = true;
      for (const Fragment& f : fragments) {
        if (f.token != kNoToken) {
          out.push_back(f.token);
          prev_special = true;
          continue;
        }
        const std::string escaped = escape_spaces(fragment_text(f), vocab.add_space_prefix && prev_special);
        spm_encode(vocab, escaped, &out);
        prev_special = false;
      }
      if (add_special && vocab.add_eos) out.push_back(vocab.eos);
      break;
    }
    case VocabType::kBpe: {
      if (add_special && vocab.add_bos) out.push_back(vocab.bos);
      for (const Fragment& f : fragments) {
        if (f.token != kNoToken) {
          out.push_back(f.token);
        } else {
          bpe_encode(vocab, fragment_text(f), &out);
        }
      }
      if (add_special && vocab.add_eos) out.push_back(vocab.eos);
      break;
    }
    case VocabType::kWpm: {
      // BERT: [CLS] text [SEP]; llama.cpp adds both whenever add_special is set.
      if (add_special && vocab.bos != kNoToken) out.push_back(vocab.bos);
      for (const Fragment& f : fragments) {
        if (f.token != kNoToken) {
          out.push_back(f.token);
        } else {
          wpm_encode(vocab, fragment_text(f), &out);
        }
      }
      if (add_special && vocab.sep != kNoToken) out.push_back(vocab.sep);
      break;
    }
  }
  return out;
}

}  // namespace vesper::tokenizer
