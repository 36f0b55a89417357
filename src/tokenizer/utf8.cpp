#include "tokenizer/utf8.h"

#include "core/check.h"

namespace vesper::tokenizer {

size_t utf8_sequence_length(uint8_t lead) {
  static constexpr uint8_t kLengthByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengthByHighNibble[lead >> 4];
}

void append_utf8(uint32_t cpt, std::string* out) {
  VESPER_CHECK(cpt <= 0x10FFFF, "code point 0x%X out of range", cpt);
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// One code point at `pos` with llama.cpp's rules; advances `pos`.
uint32_t decode_one_lenient(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const size_t i = *pos;
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  size_t len = 0;
  uint32_t cpt = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cpt = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cpt = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cpt = b0 & 0x07;
  } else {  // stray continuation byte or 0xF8..0xFF
    *pos += 1;
    return kReplacementCodepoint;
  }
  if (i + len > s.size()) {
    *pos += 1;
    return kReplacementCodepoint;
  }
  for (size_t k = 1; k < len; ++k) {
    if (!is_continuation(byte(i + k))) {
      *pos += 1;
      return kReplacementCodepoint;
    }
    cpt = (cpt << 6) | (byte(i + k) & 0x3F);
  }
  *pos += len;
  if ((cpt >= 0xD800 && cpt <= 0xDFFF) || cpt > 0x10FFFF) return kReplacementCodepoint;
  return cpt;
}

}  // namespace

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) cpts.push_back(decode_one_lenient(text, &pos));
  return cpts;
}

std::string to_valid_utf8_lenient(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) append_utf8(decode_one_lenient(text, &pos), &out);
  return out;
}

size_t repair_utf8(std::string_view in, bool final, std::string* out) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(in[i]); };
  const auto replace = [&] { out->append("\xEF\xBF\xBD"); };
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) {
      // Copy the ASCII run at once.
      size_t j = i + 1;
      while (j < n && byte(j) < 0x80) ++j;
      out->append(in.data() + i, j - i);
      i = j;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80;  // allowed range of the second byte (Unicode Table 3-7)
    uint8_t hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {  // 0x80..0xC1, 0xF5..0xFF never start a sequence
      replace();
      ++i;
      continue;
    }
    // Length of the valid prefix of this sequence.
    size_t k = 1;
    while (k < len && i + k < n) {
      const uint8_t b = byte(i + k);
      const bool ok = (k == 1) ? (b >= lo && b <= hi) : is_continuation(b);
      if (!ok) break;
      ++k;
    }
    if (k == len) {
      out->append(in.data() + i, len);
      i += len;
    } else if (i + k == n && !final) {
      return i;  // incomplete but still possibly valid: keep for later
    } else {
      replace();  // the maximal valid subpart becomes one U+FFFD
      i += k;
    }
  }
  return n;
}

bool is_valid_utf8(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > n) return false;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return false;
    for (size_t k = 2; k < len; ++k)
      if (!is_continuation(byte(i + k))) return false;
    i += len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  repair_utf8(text, true, &out);
  return out;
}

}  // namespace vesper::tokenizer
