// The Hugging Face tokenizer loader: a checkpoint directory's tokenizer.json (with
// tokenizer_config.json, special_tokens_map.json, generation_config.json and config.json when
// present) turned into the tokenizer.ggml.* metadata a GGUF would carry, so that Hugging Face
// checkpoints reach the one Tokenizer (Tokenizer::from_gguf) through an in-memory GGUF: a second
// loader, not a second tokenizer. What it writes follows llama.cpp's convert_hf_to_gguf.py, with
// two additions that make the result tokenize exactly like Hugging Face's BPE (see README.md):
// SentencePiece-style vocabularies carry tokenizer.ggml.merges (Vesper then merges by rank), and
// a generation_config.json list of EOS ids becomes tokenizer.ggml.eog_token_ids.
//
// Supported: model.type "BPE" in two families.
//   SentencePiece-style (llama-2, mistral): byte_fallback, spaces as U+2581 by the normalizer
//     (Prepend + Replace) or a Metaspace pre-tokenizer. -> tokenizer.ggml.model "llama".
//   Byte-level (gpt2, llama-3, qwen2): a ByteLevel pre-tokenizer, optionally after Split regexes
//     that must equal a bpe_presets.cpp preset. -> tokenizer.ggml.model "gpt2".
// Anything else that would change the ids (Unigram, WordPiece, other normalizers or
// pre-tokenizers, BPE dropout, ...) is an error naming the file and the field.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::tokenizer {

// The tokenizer.ggml.* metadata (and tokenizer.chat_template) equivalent to the Hugging Face
// tokenizer in checkpoint directory `dir`: tokenizer.json, plus tokenizer_config.json,
// special_tokens_map.json and generation_config.json when present. Errors name the file and the
// field.
Result<std::vector<std::pair<std::string, gguf::Value>>> hf_tokenizer_metadata(
    const std::string& dir);

}  // namespace vesper::tokenizer
