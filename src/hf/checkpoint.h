// Hugging Face checkpoint directories as models: config.json, model.safetensors (or shards named
// by model.safetensors.index.json, or every *.safetensors), tokenizer.json and its companions,
// assembled into the GgufFile that llama.cpp's convert_hf_to_gguf.py would write for the same
// model, so that every consumer of a GGUF (the model, the tokenizer, `vesper quantize`) reads it
// unchanged.
//
// What the assembly does to the weights:
//  - matrices (and the embeddings) stay where they are in the mapped safetensors files, in their
//    stored dtype (f32, f16, bf16), with the shape reversed (torch [out, in] is ggml [in, out]);
//  - llama / mistral q_proj and k_proj rows are permuted from Hugging Face's rotate-half order into
//    the adjacent-pair order of llama.cpp's RoPE (the permute of convert_hf_to_gguf), into memory
//    of their own; qwen2 / qwen3 run NeoX-style RoPE on the rows as stored;
//  - norm weights and biases are widened to f32 (what the GGUF conversion stores);
//  - llama3 RoPE scaling becomes the rope_freqs.weight tensor.
// Every tensor's shape is checked against config.json; errors name the file and the tensor.
#pragma once

#include <string>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::hf {

// Whether `path` is a directory holding config.json (a checkpoint to load with load_checkpoint).
bool is_checkpoint_dir(const std::string& path);

// The safetensors files of the checkpoint in `dir`: those model.safetensors.index.json names,
// else model.safetensors, else every *.safetensors. Errors name the directory or the index.
Result<std::vector<std::string>> checkpoint_weight_files(const std::string& dir);

// Loads the checkpoint in `dir`. A checkpoint without tokenizer.json loads (its model runs) but
// has no tokenizer metadata, so commands that need text say the tokenizer is missing.
Result<gguf::GgufFile> load_checkpoint(const std::string& dir);

}  // namespace vesper::hf
