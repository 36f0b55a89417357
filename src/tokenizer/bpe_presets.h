// BPE presets: what each tokenizer.ggml.pre value means for a byte-level BPE vocabulary, as
// llama.cpp's llama_vocab::impl::load and llm_tokenizer_bpe define it: the pre-tokenizer
// regexes (applied in sequence, see regex_splitter.h) and the flags that differ per model
// family. Internal to the tokenizer module.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vesper::tokenizer {

struct BpePreset {
  std::vector<std::string> patterns;
  bool clean_spaces = true;    // decode removes spaces before punctuation (HF clean_up_tokenization_spaces)
  bool ignore_merges = false;  // a pre-token that is itself a token is emitted whole (tiktoken-style)
  bool add_bos = false;        // default of tokenizer.ggml.add_bos_token
  bool add_sep = false;        // default of tokenizer.ggml.add_sep_token
  bool no_default_bos = false; // the model has no BOS unless tokenizer.ggml.bos_token_id says so
};

// The preset for a tokenizer.ggml.pre value; nullopt when unknown. An empty name (the key is
// missing) means "default", as in llama.cpp.
std::optional<BpePreset> find_bpe_preset(std::string_view pre);

// Every accepted tokenizer.ggml.pre value, for error messages.
std::vector<std::string_view> bpe_preset_names();

}  // namespace vesper::tokenizer
