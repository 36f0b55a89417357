// Small vocabularies written with gguf::GgufWriter, for tests that need precise control of
// the metadata (error paths, merge order, add_eos).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"

namespace vesper::tokenizer::tok_test {

using Metadata = std::vector<std::pair<std::string, gguf::Value>>;

// A valid SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, then "\u2581" "a" "b"
// "\u2581a" "ab" "\u2581ab" with scores that make "ab" merge before "\u2581a".
Metadata spm_metadata();

// A valid byte-level BPE vocabulary (gpt2, pre "gpt-2"): the 256 byte-level characters, then
// "Ġa" "ab" "Ġab" and <|endoftext|>, with merges "Ġ a", "a b", "Ġa b".
Metadata bpe_metadata();

// Sets `key` (replacing it) or, with `remove`, drops it.
void set_key(Metadata* md, const std::string& key, gguf::Value value);
void remove_key(Metadata* md, const std::string& key);

// Writes `md` to a fresh file under the test temp dir and returns its path.
std::string write_gguf(const std::string& name, const Metadata& md);

}  // namespace vesper::tokenizer::tok_test
