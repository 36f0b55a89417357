// UTF-8 helpers for the tokenizer: llama.cpp-compatible lenient decoding (what the encoders
// see), and strict repair (what decoded text promises: valid UTF-8, U+FFFD for every invalid
// sequence). Internal to the tokenizer module.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vesper::tokenizer {

inline constexpr uint32_t kReplacementCodepoint = 0xFFFD;

// Length of the sequence a lead byte announces, as llama.cpp counts it: 1 for ASCII, stray
// continuation bytes and 0xF8..0xFF; 2, 3 or 4 for the lead bytes. Used to cut text into
// "characters" where llama.cpp does (SPM symbols, BPE symbols) even when it is not valid UTF-8.
size_t utf8_sequence_length(uint8_t lead);

// Appends the UTF-8 encoding of `cpt` (which must be <= 0x10FFFF).
void append_utf8(uint32_t cpt, std::string* out);

// Decodes like llama.cpp's unicode_cpts_from_utf8: a byte that does not start a complete
// sequence becomes U+FFFD and decoding resumes at the next byte. Overlong forms decode to their
// value. Surrogates and values above U+10FFFF (which llama.cpp cannot re-encode) become U+FFFD.
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

// decode_utf8_lenient then re-encode: always valid UTF-8, and identical to `text` when `text`
// already was valid UTF-8.
std::string to_valid_utf8_lenient(std::string_view text);

// Strict UTF-8 repair (Unicode's "maximal subpart" practice, as in WHATWG and ICU): appends the
// valid prefix of `in` to `out`, replacing each invalid sequence with U+FFFD. Returns the number
// of bytes consumed. When `final` is false, a trailing sequence that is incomplete but could
// still become valid is not consumed (the caller keeps it for later); when `final` is true it
// becomes U+FFFD. Repairing a stream in pieces gives the same result as repairing it whole.
size_t repair_utf8(std::string_view in, bool final, std::string* out);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF).
bool is_valid_utf8(std::string_view text);

// repair_utf8 on a whole string.
std::string sanitize_utf8(std::string_view text);

}  // namespace vesper::tokenizer
