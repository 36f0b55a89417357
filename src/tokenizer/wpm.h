// BERT WordPiece as llama.cpp's llm_tokenizer_wpm runs it: normalize (lowercase and strip
// accents when the vocabulary says so, drop control characters), split on whitespace and
// around punctuation and CJK ideographs, then match each word greedily, longest token first,
// against the vocabulary (where word-initial pieces carry U+2581 and continuations do not).
// A word that cannot be matched completely becomes the unknown token. Internal to the module.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace vesper::tokenizer {

void wpm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

}  // namespace vesper::tokenizer
