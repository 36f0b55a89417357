// Text to token ids for a Vocab: the special-token partition shared by every vocabulary type,
// then SPM (spm.h), BPE (bpe.h) or WPM (wpm.h) on each remaining text fragment, with BOS/EOS
// as the vocabulary asks. Tokenizer::encode is this function. Internal to the module.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace vesper::tokenizer {

std::vector<int32_t> encode_text(const Vocab& vocab, std::string_view text, bool add_special,
                                 bool parse_special);

// A piece of the input after the special-token partition: either a token matched whole, or
// the bytes [begin, end) of text left for the vocabulary's algorithm.
struct Fragment {
  int32_t token = kNoToken;  // kNoToken for text
  size_t begin = 0;
  size_t end = 0;
};

// Splits `text` at the occurrences of special-token texts, as llama.cpp's
// tokenizer_st_partition: tokens are tried longest text first; each takes every
// non-overlapping occurrence (left to right) in the text fragments that remain, honouring its
// lstrip/rstrip attributes. Control and unknown tokens take part only when `parse_special`;
// user-defined tokens always do.
std::vector<Fragment> partition_special(const Vocab& vocab, std::string_view text, bool parse_special);

}  // namespace vesper::tokenizer
