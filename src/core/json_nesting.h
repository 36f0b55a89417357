// A guard for JSON read from outside (request bodies, model and adapter files): how deep arrays
// and objects nest, found by a linear scan that skips strings and their escapes, so that no
// recursive parser (or recursive destructor) ever sees a document deeper than its caller allows.
#pragma once

#include <cstddef>
#include <string_view>

namespace vesper {

// The byte offset in `s` where nesting first exceeds `max_depth`, or npos.
inline size_t find_json_nesting_over(std::string_view s, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace vesper
