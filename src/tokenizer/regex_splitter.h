// RegexSplitter: the pre-tokenizer's word splitting, as llama.cpp's unicode_regex_split does
// it: a list of PCRE2 patterns (compiled once, with PCRE2_UTF | PCRE2_UCP) applied in sequence;
// each pattern cuts every current piece into its matches and the gaps between them, and both
// the matches and the gaps become pieces for the next pattern. Internal to the tokenizer module.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace vesper::tokenizer {

// A piece of the text: bytes [begin, end).
struct Span {
  size_t begin = 0;
  size_t end = 0;
};

class RegexSplitter {
 public:
  // Compiles `patterns`; the error names the pattern and PCRE2's reason.
  static Result<RegexSplitter> compile(const std::vector<std::string>& patterns);

  // Splits valid UTF-8 `text` (the caller guarantees validity) into non-empty spans that cover
  // it in order. Thread-safe: all scratch state is per call.
  std::vector<Span> split(std::string_view text) const;

  size_t num_patterns() const { return patterns_.size(); }

 private:
  struct Compiled;
  std::vector<std::shared_ptr<const Compiled>> patterns_;
};

}  // namespace vesper::tokenizer
