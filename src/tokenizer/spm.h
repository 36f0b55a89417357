// SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm runs it: start from UTF-8
// characters, repeatedly merge the adjacent pair whose concatenation is the token with the
// highest score (ties: leftmost), then emit each final piece as its token, or as <0xXX> byte
// tokens when it is not one. O(n log n) in the text length. Internal to the module.
// A vocabulary with merges (Vocab::spm_merges_by_rank, from a Hugging Face tokenizer.json)
// merges as Hugging Face's BPE does instead: only the listed pairs, lowest rank first (ties:
// leftmost); byte fallback is the same.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace vesper::tokenizer {

// `text` already has spaces replaced by U+2581 (and the space prefix added).
void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

}  // namespace vesper::tokenizer
