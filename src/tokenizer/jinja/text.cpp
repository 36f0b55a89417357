#include "tokenizer/jinja/text.h"

#include <algorithm>

namespace vesper::tokenizer::jinja::text {

namespace {

constexpr uint32_t kEscapeBase = 0xDC00;  // surrogateescape: byte b decodes to U+DC00 + b

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not valid.
size_t valid_sequence(std::string_view s, size_t i, uint32_t* cp) {
  const auto c0 = static_cast<unsigned char>(s[i]);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  size_t len;
  uint32_t v;
  uint32_t min;
  if ((c0 & 0xE0) == 0xC0) {
    len = 2, v = c0 & 0x1F, min = 0x80;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3, v = c0 & 0x0F, min = 0x800;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4, v = c0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (!is_cont(c)) return 0;
    v = (v << 6) | (c & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

bool in_set(uint32_t cp, const std::vector<uint32_t>& set) {
  return std::find(set.begin(), set.end(), cp) != set.end();
}

bool is_cased(uint32_t cp) { return to_upper(cp) != cp || to_lower(cp) != cp; }

bool is_jinja_title_separator(uint32_t cp) {
  return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_space(cp);
}

}  // namespace

std::vector<uint32_t> decode(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    const size_t len = valid_sequence(s, i, &cp);
    if (len == 0) {
      out.push_back(kEscapeBase + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(cp);
      i += len;
    }
  }
  return out;
}

void append_codepoint(uint32_t cp, std::string* out) {
  if (cp >= kEscapeBase + 0x80 && cp <= kEscapeBase + 0xFF) {
    out->push_back(static_cast<char>(cp - kEscapeBase));
  } else if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(const uint32_t* begin, const uint32_t* end) {
  std::string out;
  out.reserve(static_cast<size_t>(end - begin));
  for (const uint32_t* p = begin; p != end; ++p) append_codepoint(*p, &out);
  return out;
}

std::string encode(const std::vector<uint32_t>& cps) {
  return encode(cps.data(), cps.data() + cps.size());
}

size_t length(std::string_view s) {
  size_t n = 0;
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp;
    const size_t len = valid_sequence(s, i, &cp);
    i += len == 0 ? 1 : len;
    ++n;
  }
  return n;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

bool is_alpha(uint32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return true;
  if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return true;
  if (cp >= 0xC0 && cp <= 0x24F) return cp != 0xD7 && cp != 0xF7;
  if (cp >= 0x370 && cp <= 0x3FF) return cp != 0x37E && cp != 0x387 && cp != 0x375;
  if (cp >= 0x400 && cp <= 0x52F) return !(cp >= 0x482 && cp <= 0x489);
  if (cp >= 0x3040 && cp <= 0x30FF) return true;        // kana
  if (cp >= 0x4E00 && cp <= 0x9FFF) return true;        // CJK unified ideographs
  if (cp >= 0xAC00 && cp <= 0xD7A3) return true;        // Hangul syllables
  return false;
}

uint32_t to_upper(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  if (cp == 0xB5) return 0x39C;
  if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
  if (cp == 0xFF) return 0x178;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x131) return 'I';
    if (cp == 0x17F) return 'S';
    if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) return cp & ~1u;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) {
      return (cp % 2 == 0) ? cp - 1 : cp;
    }
    return cp;
  }
  if (cp >= 0x3B1 && cp <= 0x3C9) return cp == 0x3C2 ? 0x3A3 : cp - 32;
  if (cp == 0x3AC) return 0x386;
  if (cp >= 0x3AD && cp <= 0x3AF) return cp - 37;
  if (cp == 0x3CC) return 0x38C;
  if (cp == 0x3CD || cp == 0x3CE) return cp - 63;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF)) return cp & ~1u;
  return cp;
}

uint32_t to_lower(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if (cp >= 0x100 && cp <= 0x17F) {
    if (cp == 0x130) return cp;
    if ((cp >= 0x100 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177)) return cp | 1u;
    if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E)) {
      return (cp % 2 == 1) ? cp + 1 : cp;
    }
    return cp;
  }
  if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) return cp + 32;
  if (cp == 0x386) return 0x3AC;
  if (cp >= 0x388 && cp <= 0x38A) return cp + 37;
  if (cp == 0x38C) return 0x3CC;
  if (cp == 0x38E || cp == 0x38F) return cp + 63;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if ((cp >= 0x460 && cp <= 0x481) || (cp >= 0x48A && cp <= 0x4BF)) return cp | 1u;
  return cp;
}

std::string upper(std::string_view s) {
  auto cps = decode(s);
  for (auto& c : cps) c = to_upper(c);
  return encode(cps);
}

std::string lower(std::string_view s) {
  auto cps = decode(s);
  for (auto& c : cps) c = to_lower(c);
  return encode(cps);
}

std::string capitalize(std::string_view s) {
  auto cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
  return encode(cps);
}

std::string python_title(std::string_view s) {
  auto cps = decode(s);
  bool previous_cased = false;
  for (auto& c : cps) {
    const bool cased = is_cased(c);
    c = previous_cased ? to_lower(c) : to_upper(c);
    previous_cased = cased;
  }
  return encode(cps);
}

std::string jinja_title(std::string_view s) {
  auto cps = decode(s);
  bool word_start = true;
  for (auto& c : cps) {
    if (is_jinja_title_separator(c)) {
      word_start = true;
      continue;
    }
    c = word_start ? to_upper(c) : to_lower(c);
    word_start = false;
  }
  return encode(cps);
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto cps = decode(s);
  std::vector<uint32_t> set;
  if (chars != nullptr) set = decode(*chars);
  auto strippable = [&](uint32_t c) { return chars == nullptr ? is_space(c) : in_set(c, set); };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strippable(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strippable(cps[e - 1])) --e;
  }
  return encode(cps.data() + b, cps.data() + e);
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr) {
    const auto cps = decode(s);
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_space(cps[e - 1])) --e;
        out.push_back(encode(cps.data() + i, cps.data() + e));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_space(cps[j])) ++j;
      out.push_back(encode(cps.data() + i, cps.data() + j));
      i = j;
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t pos = s.find(*sep, start);
    if (pos == std::string_view::npos) break;
    out.emplace_back(s.substr(start, pos - start));
    start = pos + sep->size();
  }
  out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep == nullptr) {
    const auto cps = decode(s);
    size_t e = cps.size();
    while (e > 0) {
      while (e > 0 && is_space(cps[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && is_space(cps[b])) ++b;
        out.push_back(encode(cps.data() + b, cps.data() + e));
        break;
      }
      size_t b = e;
      while (b > 0 && !is_space(cps[b - 1])) --b;
      out.push_back(encode(cps.data() + b, cps.data() + e));
      e = b;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t pos = s.rfind(*sep, end - sep->size());
    if (pos == std::string_view::npos) break;
    out.emplace_back(s.substr(pos + sep->size(), end - pos - sep->size()));
    end = pos;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  const auto cps = decode(s);
  std::vector<std::string> out;
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    const uint32_t c = cps[i];
    const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      ++i;
      continue;
    }
    out.push_back(encode(cps.data() + start, cps.data() + i));
    i += (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ? 2 : 1;
    start = i;
  }
  if (start < cps.size()) out.push_back(encode(cps.data() + start, cps.data() + cps.size()));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    const auto cps = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(to);
        ++done;
      }
      if (i < cps.size()) append_codepoint(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t pos = s.find(from, start);
    if (pos == std::string_view::npos) break;
    out.append(s.substr(start, pos - start));
    out.append(to);
    start = pos + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t pos = reverse ? s.rfind(sub) : s.find(sub);
  if (pos == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, pos)));
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace vesper::tokenizer::jinja::text
