// Characters in and out of the regex converter: UTF-8 text to code points (decode_utf8), code
// point sets written as GBNF items (classes, literals), and the canonical spelling of characters
// between a JSON string's quotes (json_string_char_expression, append_json_string_char), which
// the JSON schema converter shares (regex.h).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/regex.h"
#include "grammar/regex_internal.h"

namespace vesper::grammar {
namespace regex_detail {
namespace {

CodepointRanges intersect(const CodepointRanges& a, const CodepointRanges& b) {
  CodepointRanges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return out;
}

// Code points that may stand raw between a JSON string's quotes (the `char` rule of
// json_schema.h: not ", not \, not a control character, not U+007F).
const CodepointRanges& json_raw_set() {
  static const CodepointRanges s =
      normalize({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}, {0x80, kMaxCodepoint}});
  return s;
}

char hex_digit(uint32_t v) {
  return "0123456789abcdef"[v & 15];
}

std::string hex(uint32_t v, int digits) {
  std::string s(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4)
    s[static_cast<size_t>(i)] = "0123456789ABCDEF"[v & 15];
  return s;
}

// One code point inside a GBNF class.
void append_class_char(uint32_t cp, std::string& out) {
  switch (cp) {
    case '\\':
    case ']':
    case '[':
    case '-':
    case '^':
    case '"':
      out += '\\';
      out += static_cast<char>(cp);
      return;
    default:
      break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    out += "\\x" + hex(cp, 2);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp <= 0xFFFF) {
    out += "\\u" + hex(cp, 4);
  } else {
    out += "\\U" + hex(cp, 8);
  }
}

std::string literal_of(const std::vector<uint32_t>& cps) {
  std::string bytes;
  for (uint32_t cp : cps) append_utf8(cp, bytes);
  return gbnf_literal(bytes);
}

}  // namespace

std::string plain_set_expression(const CodepointRanges& set) {
  if (set.empty()) return "[]";
  if (set.size() == 1 && set[0].first == set[0].second) return literal_of({set[0].first});
  const CodepointRanges negated = complement(set);
  if (negated.empty()) return ".";  // every code point
  const bool negate = negated.size() < set.size();
  const CodepointRanges& ranges = negate ? negated : set;
  std::string out = negate ? "[^" : "[";
  for (auto [lo, hi] : ranges) {
    append_class_char(lo, out);
    if (hi == lo) continue;
    if (hi > lo + 1) out += '-';
    append_class_char(hi, out);
  }
  return out + "]";
}

}  // namespace regex_detail

using regex_detail::hex_digit;
using regex_detail::intersect;
using regex_detail::json_raw_set;
using regex_detail::kMaxCodepoint;
using regex_detail::plain_set_expression;

std::optional<std::vector<uint32_t>> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<uint8_t>(text[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t cp = 0, min = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return std::nullopt;
    }
    if (i + n > text.size()) return std::nullopt;
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<uint8_t>(text[i + k]);
      if ((b & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out.push_back(cp);
    i += n;
  }
  return out;
}

void append_json_string_char(uint32_t cp, std::string& out) {
  switch (cp) {
    case '"':
      out += "\\\"";
      return;
    case '\\':
      out += "\\\\";
      return;
    case 0x08:
      out += "\\b";
      return;
    case 0x09:
      out += "\\t";
      return;
    case 0x0A:
      out += "\\n";
      return;
    case 0x0C:
      out += "\\f";
      return;
    case 0x0D:
      out += "\\r";
      return;
    default:
      break;
  }
  if (cp < 0x20 || cp == 0x7F) {
    out += "\\u00";
    out += hex_digit(cp >> 4);
    out += hex_digit(cp);
    return;
  }
  append_utf8(cp, out);
}

std::string json_string_char_expression(const CodepointRanges& chars) {
  if (chars.empty()) return "[]";
  std::vector<std::string> alts;
  const CodepointRanges raw = intersect(chars, json_raw_set());
  if (!raw.empty()) alts.push_back(plain_set_expression(raw));
  // Short escapes: one `"\\" [...]` item for all of them.
  std::string short_letters;
  std::vector<uint32_t> short_cps;
  // \u00XX escapes, grouped by their high hex digit (0, 1 or 7).
  std::vector<std::vector<uint32_t>> by_high(8);
  for (auto [lo, hi] : intersect(chars, complement(json_raw_set()))) {
    for (uint32_t cp = lo; cp <= hi; ++cp) {
      std::string spelled;
      append_json_string_char(cp, spelled);
      if (spelled.size() == 2) {
        short_letters += spelled[1];
        short_cps.push_back(static_cast<uint32_t>(static_cast<unsigned char>(spelled[1])));
      } else {
        by_high[cp >> 4].push_back(cp & 15);
      }
    }
  }
  if (short_cps.size() == 1) {
    alts.push_back(gbnf_literal("\\" + short_letters));
  } else if (!short_cps.empty()) {
    CodepointRanges letters;
    for (uint32_t c : short_cps) letters.push_back({c, c});
    alts.push_back(gbnf_literal("\\") + " " + plain_set_expression(normalize(letters)));
  }
  for (uint32_t high = 0; high < by_high.size(); ++high) {
    if (by_high[high].empty()) continue;
    std::string prefix = "\\u00";
    prefix += hex_digit(high);
    if (by_high[high].size() == 1) {
      prefix += hex_digit(by_high[high][0]);
      alts.push_back(gbnf_literal(prefix));
      continue;
    }
    CodepointRanges lows;
    for (uint32_t low : by_high[high]) {
      const auto d = static_cast<uint32_t>(static_cast<unsigned char>(hex_digit(low)));
      lows.push_back({d, d});
    }
    alts.push_back(gbnf_literal(prefix) + " " + plain_set_expression(normalize(lows)));
  }
  if (alts.size() == 1 && alts.front().find(' ') == std::string::npos) return alts.front();
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

}  // namespace vesper::grammar
