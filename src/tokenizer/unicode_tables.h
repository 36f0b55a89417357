// Generated Unicode data tables (unicode_tables.cpp, written by gen_unicode_tables.py).
// Internal to the tokenizer module; use the functions in unicode.h instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vesper::tokenizer::unicode_tables {

struct CodepointPair {
  uint32_t from;
  uint32_t to;
};

struct CodepointRangeMap {
  uint32_t first;
  uint32_t last;
  uint32_t to;
};

extern const char kUnicodeVersion[];
// Sorted by `from`.
extern const CodepointPair kLowercase[];
extern const size_t kLowercaseSize;
// Sorted, non-overlapping ranges.
extern const CodepointRangeMap kNfdBase[];
extern const size_t kNfdBaseSize;

}  // namespace vesper::tokenizer::unicode_tables
