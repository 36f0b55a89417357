// ModelConfig: a model's hyper-parameters, read from GGUF metadata ({arch}.* keys), and the
// registry of supported architectures (llama family: llama, qwen2, qwen3).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::model {

// What distinguishes one member of the llama family from another.
struct ArchitectureTraits {
  std::string name;
  backend::RopeStyle rope_style = backend::RopeStyle::kNormal;
  bool qkv_bias = false;  // qwen2: Q, K, V projections have biases
  bool qk_norm = false;   // qwen3: per-head RMSNorm on Q and K before RoPE
};

// Names of the supported architectures, for error messages and --help.
std::vector<std::string> supported_architectures();

enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct ModelConfig {
  ArchitectureTraits arch;
  std::string name;  // general.name, or the architecture
  int64_t n_vocab = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // {arch}.attention.key_length, else n_embd / n_head
  int64_t n_ff = 0;
  int64_t context_length = 0;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int64_t rope_dims = 0;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_freq_scale = 1.0f;  // 1 / scaling factor for linear and YaRN scaling
  // YaRN (rope.scaling.type yarn): the context the model was trained at, and the ramp between
  // interpolated and original frequencies (llama.cpp's keys and defaults).
  int64_t rope_original_context = 0;
  float yarn_ext_factor = 1.0f;
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;

  // The rotated dimension pairs where YaRN's ramp starts and ends (ggml_rope_yarn_corr_dims).
  std::array<float, 2> yarn_corr_dims() const;

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and validates the hyper-parameters. n_vocab comes from the token embedding's shape.
// Errors name the file and the key (or the unsupported architecture, listing the supported).
Result<ModelConfig> read_model_config(const gguf::GgufFile& file);

}  // namespace vesper::model
