// Byte-level BPE as llama.cpp's llm_tokenizer_bpe runs it: the pre-tokenizer cuts the text
// into words; each word's bytes are mapped to GPT-2's byte alphabet; within a word, the
// adjacent pair with the lowest merge rank is merged repeatedly (ties: leftmost); each final
// piece is emitted as its token. Words are independent, so the cost is linear in the text
// length for bounded words and O(w log w) within a word. Internal to the module.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace vesper::tokenizer {

void bpe_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>* out);

}  // namespace vesper::tokenizer
