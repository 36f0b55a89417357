#include "grammar/utf8_ranges.h"

#include <algorithm>

namespace vesper::grammar {
namespace {

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// [s, e] within one encoded length, split until every position's bytes form one range (the
// classic construction: a range whose low end is not at a multiple of 64^i, or whose high end
// is not just below one, is cut there).
void split(uint32_t s, uint32_t e, std::vector<Utf8Sequence>& out) {
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (s <= boundary && e > boundary) {
      split(s, boundary, out);
      split(boundary + 1, e, out);
      return;
    }
  if (e <= 0x7F) {
    out.push_back({{static_cast<uint8_t>(s), static_cast<uint8_t>(e)}});
    return;
  }
  for (int i = 1; i <= 3; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((s & ~m) != (e & ~m)) {
      if ((s & m) != 0) {
        split(s, s | m, out);
        split((s | m) + 1, e, out);
        return;
      }
      if ((e & m) != m) {
        split(s, (e & ~m) - 1, out);
        split(e & ~m, e, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(s, a);
  append_utf8(e, b);
  Utf8Sequence seq;
  for (size_t i = 0; i < a.size(); ++i)
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  out.push_back(std::move(seq));
}

}  // namespace

CodepointRanges normalize(CodepointRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges merged;
  for (auto [lo, hi] : ranges) {
    if (!merged.empty() && lo <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, hi);
    else
      merged.push_back({lo, hi});
  }
  CodepointRanges out;
  for (auto [lo, hi] : merged) {
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      out.push_back({lo, hi});
      continue;
    }
    if (lo < kSurrogateLo) out.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) out.push_back({kSurrogateHi + 1, hi});
  }
  return out;
}

CodepointRanges complement(const CodepointRanges& ranges) {
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(ranges)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return normalize(out);
}

std::vector<Utf8Sequence> utf8_sequences(const CodepointRanges& ranges) {
  std::vector<Utf8Sequence> out;
  for (auto [lo, hi] : ranges) split(lo, hi, out);
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace vesper::grammar
