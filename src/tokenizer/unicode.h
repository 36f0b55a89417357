// Unicode facts the tokenizers need, from two sources: PCRE2's Unicode tables (general
// categories and \s, so they agree with the pre-tokenizer regexes), and generated tables
// (lowercase, NFD base) from unicode_tables.cpp. Also the GPT-2 byte-level alphabet.
// Internal to the tokenizer module.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vesper::tokenizer {

// Category flags of one code point (several may be set: e.g. U+0020 is whitespace and Zs).
enum CodepointFlag : uint8_t {
  kCpWhitespace = 1 << 0,   // PCRE2 \s with PCRE2_UCP
  kCpLetter = 1 << 1,       // \p{L}
  kCpNumber = 1 << 2,       // \p{N}
  kCpPunctuation = 1 << 3,  // \p{P}
  kCpSymbol = 1 << 4,       // \p{S}
  kCpMark = 1 << 5,         // \p{M} (accents and other combining marks)
  kCpControl = 1 << 6,      // \p{C} (Cc, Cf, Cn, Co, Cs)
  kCpSeparator = 1 << 7,    // \p{Z}
};

// Flags of `cpt`. The table behind it is built from PCRE2 once per process, on first use
// (tens of milliseconds); thread-safe.
uint8_t codepoint_flags(uint32_t cpt);

// The first code point of the lowercase form (as Python's str.lower()[0]); `cpt` if none.
uint32_t to_lower(uint32_t cpt);

// The first code point of the canonical decomposition (NFD); `cpt` if it has none. For
// precomposed letters this drops the accents: U+00FC (u with diaeresis) -> 'u'.
uint32_t nfd_base(uint32_t cpt);

// CJK ideographs as BERT's BasicTokenizer defines them (each becomes its own word).
bool is_bert_chinese_char(uint32_t cpt);

// GPT-2's byte-level BPE alphabet: every byte maps to one printable code point (printable
// Latin-1 bytes to themselves, the rest to U+0100 upward), so token texts never hold raw
// control bytes or spaces (' ' is 'Ġ' U+0120).
std::string_view byte_to_bpe_char(uint8_t byte);  // UTF-8 of the mapped code point
int bpe_char_to_byte(uint32_t cpt);                // -1 when `cpt` is not in the alphabet

}  // namespace vesper::tokenizer
