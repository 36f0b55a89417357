// The inverse of load_checkpoint: a llama-family GGUF with float weights written as a Hugging Face
// checkpoint directory (config.json, model.safetensors, and a donor's tokenizer files), so that
// loading the directory gives the GGUF's tensors back bit for bit. `vesper synth --format hf`
// writes its benchmark checkpoints with it (the input of `vesper quantize --to exl2`).
#pragma once

#include <string>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::hf {

// Writes `model` (architecture llama, qwen2 or qwen3; matrices f32, f16 or bf16) into `dir`
// (created if missing):
//  - config.json with the architecture's class, the sizes, rope_theta, linear rope_scaling, the
//    RMS epsilon, max_position_embeddings (the GGUF's context length), tie_word_embeddings,
//    head_dim where the GGUF names key_length;
//  - model.safetensors with Hugging Face's tensor names: matrices in their stored dtype, q/k rows
//    of llama back in rotate-half order, norms and biases as stored (f32);
//  - tokenizer.json, tokenizer_config.json and special_tokens_map.json copied from
//    `tokenizer_from` (a directory holding tokenizer.json; empty: none, and the checkpoint has no
//    tokenizer).
// What a config.json cannot say is an error naming the GGUF key or tensor: a quantized matrix,
// llama3 rope_freqs, partial rotary dimensions, a RoPE scaling other than linear.
Status write_checkpoint(const gguf::GgufFile& model, const std::string& dir,
                        const std::string& tokenizer_from);

}  // namespace vesper::hf
