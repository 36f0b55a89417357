// Random-weight llama-family models of any shape and type, written as GGUF: benchmark inputs
// for `vesper synth` and test models for the forward-pass tests. Weights are scaled so that
// activations stay finite and logits stay in a sane range through any number of layers.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"
#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::model {

struct SynthSpec {
  std::string arch = "llama";  // llama, qwen2 (adds QKV biases), qwen3 (adds Q/K norms)
  int64_t n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_head = 4;
  int64_t n_head_kv = 2;
  int64_t head_dim = 0;  // 0: n_embd / n_head; else written as attention.key_length
  int64_t n_ff = 128;
  int64_t n_vocab = 256;  // ignored when vocab_from is set (the donor's vocab size is used)
  int64_t context_length = 2048;
  int64_t rope_dims = 0;  // 0: head_dim
  float rope_freq_base = 10000.0f;
  float rope_linear_factor = 0.0f;  // > 0: linear RoPE scaling with this factor
  bool rope_freq_factors = false;   // write a rope_freqs.weight tensor (llama3-style scaling)
  bool tied_embeddings = false;     // no output.weight
  tensor::GgmlType type = tensor::GgmlType::kF32;  // weight matrices; falls back per row length
  uint64_t seed = 1;
  // A GGUF whose tokenizer.* metadata is copied, or a directory with a Hugging Face tokenizer.json
  // (a checkpoint's or tokenizer files alone); empty: a byte vocabulary.
  std::string vocab_from;
};

Status write_synthetic_model(const SynthSpec& spec, const std::string& path, ThreadPool& pool);

}  // namespace vesper::model
