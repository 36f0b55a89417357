// Code point sets and their UTF-8 form: how a character class of the grammar text becomes byte
// runs the byte-level matcher can follow.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vesper::grammar {

// Sorted, disjoint, non-adjacent [lo, hi] ranges of code points, never containing surrogates.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorts and merges `ranges`, removing surrogates (U+D800..U+DFFF have no UTF-8 form).
CodepointRanges normalize(CodepointRanges ranges);
// Every code point (U+0000..U+10FFFF, surrogates excluded) not in `ranges`.
CodepointRanges complement(const CodepointRanges& ranges);

// One UTF-8 shape: a byte range per position (e.g. [E1-EC][80-BF][80-BF]).
using Utf8Sequence = std::vector<std::pair<uint8_t, uint8_t>>;
// Byte runs whose union is exactly the UTF-8 encodings of `ranges` (normalized).
std::vector<Utf8Sequence> utf8_sequences(const CodepointRanges& ranges);

void append_utf8(uint32_t cp, std::string& out);

}  // namespace vesper::grammar
