#include "tokenizer/detokenize.h"

namespace vesper::tokenizer {

std::string clean_up_spaces(std::string_view text) {
  if (text.empty()) return {};
  // Pass 1: " ?", " !", " .", " ," lose the space.
  std::string a;
  a.reserve(text.size());
  a.push_back(text[0]);
  for (size_t i = 1; i < text.size(); ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  // Pass 2: " ' " becomes "'" (both spaces go).
  std::string b;
  b.reserve(a.size());
  b.push_back(a[0]);
  for (size_t i = 1; i < a.size(); ++i) {
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      b.push_back(x);
      a[i + 1] = '\0';  // llama.cpp blanks the skipped space, so it cannot start a pattern
      ++i;
      continue;
    }
    b.push_back(x);
  }
  // Pass 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it).
  std::string c;
  c.reserve(b.size());
  c.push_back(b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (x1 != 't' && x1 != 'd' && i + 2 < b.size()) {
        const char x2 = b[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

size_t clean_up_safe_cut(std::string_view text) {
  size_t cut = text.size();
  while (cut > 0) {
    const size_t from = cut >= 3 ? cut - 3 : 0;
    const size_t space = text.substr(from, cut - from).rfind(' ');
    if (space == std::string_view::npos) break;
    cut = from + space;
  }
  return cut;
}

}  // namespace vesper::tokenizer
