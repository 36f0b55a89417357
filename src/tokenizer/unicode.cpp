#include "tokenizer/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <memory>
#include <vector>

#include "core/check.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace vesper::tokenizer {
namespace {

constexpr uint32_t kNumCodepoints = 0x110000;

// Marks, for each pattern, the code points that PCRE2 matches, by running `\p{X}+` once over
// a string that holds every code point (surrogates excepted) in order.
std::vector<uint8_t> build_flag_table() {
  std::vector<uint8_t> flags(kNumCodepoints, 0);
  std::string all;
  all.reserve(4 * kNumCodepoints);
  std::vector<uint32_t> offsets;  // byte offset of each code point in `all`
  std::vector<uint32_t> cpts;
  offsets.reserve(kNumCodepoints);
  cpts.reserve(kNumCodepoints);
  for (uint32_t cpt = 0; cpt < kNumCodepoints; ++cpt) {
    if (cpt >= 0xD800 && cpt <= 0xDFFF) {
      flags[cpt] = kCpControl;  // Cs; never reaches the tokenizers (decoding maps it to U+FFFD)
      continue;
    }
    offsets.push_back(static_cast<uint32_t>(all.size()));
    cpts.push_back(cpt);
    append_utf8(cpt, &all);
  }
  const std::pair<const char*, uint8_t> kPatterns[] = {
      {"\\s+", kCpWhitespace},     {"\\p{L}+", kCpLetter},   {"\\p{N}+", kCpNumber},
      {"\\p{P}+", kCpPunctuation}, {"\\p{S}+", kCpSymbol},   {"\\p{M}+", kCpMark},
      {"\\p{C}+", kCpControl},     {"\\p{Z}+", kCpSeparator},
  };
  for (const auto& [pattern, flag] : kPatterns) {
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr),
        &pcre2_code_free);
    VESPER_CHECK(code != nullptr, "PCRE2 rejected built-in pattern %s (error %d)", pattern, err);
    pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);  // optional speed-up
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
        pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(all.data());
    PCRE2_SIZE start = 0;
    while (start < all.size()) {
      const int rc = pcre2_match(code.get(), subject, all.size(), start, PCRE2_NO_UTF_CHECK,
                                 md.get(), nullptr);
      if (rc < 0) {
        VESPER_CHECK(rc == PCRE2_ERROR_NOMATCH, "PCRE2 match error %d", rc);
        break;
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      auto first = std::lower_bound(offsets.begin(), offsets.end(), static_cast<uint32_t>(ov[0]));
      auto last = std::lower_bound(first, offsets.end(), static_cast<uint32_t>(ov[1]));
      for (auto it = first; it != last; ++it) flags[cpts[it - offsets.begin()]] |= flag;
      start = ov[1];
    }
  }
  return flags;
}

const std::vector<uint8_t>& flag_table() {
  static const std::vector<uint8_t> table = build_flag_table();
  return table;
}

struct ByteAlphabet {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 512> char_to_byte;  // every mapped code point is below U+0200
};

ByteAlphabet build_byte_alphabet() {
  ByteAlphabet a;
  a.char_to_byte.fill(-1);
  const auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(next++);
    append_utf8(cpt, &a.byte_to_char[b]);
    a.char_to_byte[cpt] = static_cast<int16_t>(b);
  }
  return a;
}

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = build_byte_alphabet();
  return alphabet;
}

}  // namespace

uint8_t codepoint_flags(uint32_t cpt) {
  if (cpt >= kNumCodepoints) return kCpControl;
  return flag_table()[cpt];
}

uint32_t to_lower(uint32_t cpt) {
  using unicode_tables::kLowercase;
  using unicode_tables::kLowercaseSize;
  const auto* end = kLowercase + kLowercaseSize;
  const auto* it = std::lower_bound(kLowercase, end, cpt,
                                    [](const auto& pair, uint32_t v) { return pair.from < v; });
  return (it != end && it->from == cpt) ? it->to : cpt;
}

uint32_t nfd_base(uint32_t cpt) {
  using unicode_tables::kNfdBase;
  using unicode_tables::kNfdBaseSize;
  const auto* end = kNfdBase + kNfdBaseSize;
  const auto* it = std::upper_bound(kNfdBase, end, cpt,
                                    [](uint32_t v, const auto& range) { return v < range.first; });
  if (it == kNfdBase) return cpt;
  --it;
  return (cpt <= it->last) ? it->to : cpt;
}

bool is_bert_chinese_char(uint32_t cpt) {
  // The ranges of BERT's _is_chinese_char, with llama.cpp's (and HF tokenizers') 0x2B920 start.
  return (cpt >= 0x4E00 && cpt <= 0x9FFF) || (cpt >= 0x3400 && cpt <= 0x4DBF) ||
         (cpt >= 0x20000 && cpt <= 0x2A6DF) || (cpt >= 0x2A700 && cpt <= 0x2B73F) ||
         (cpt >= 0x2B740 && cpt <= 0x2B81F) || (cpt >= 0x2B920 && cpt <= 0x2CEAF) ||
         (cpt >= 0xF900 && cpt <= 0xFAFF) || (cpt >= 0x2F800 && cpt <= 0x2FA1F);
}

std::string_view byte_to_bpe_char(uint8_t byte) { return byte_alphabet().byte_to_char[byte]; }

int bpe_char_to_byte(uint32_t cpt) {
  if (cpt >= 512) return -1;
  return byte_alphabet().char_to_byte[cpt];
}

}  // namespace vesper::tokenizer
