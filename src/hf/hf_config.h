// HfConfig: a Hugging Face checkpoint's config.json, read and validated for the architectures
// Vesper runs (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM), and
// the GGUF metadata that llama.cpp's convert_hf_to_gguf.py writes for the same model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "gguf/gguf.h"

namespace vesper::hf {

// rope_scaling of config.json (null there: type "none").
struct RopeScalingConfig {
  std::string type = "none";  // none, linear, llama3, yarn
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn (default: the config's)
  double beta_fast = 32.0;                          // yarn
  double beta_slow = 1.0;                           // yarn
};

struct HfConfig {
  std::string path;        // of config.json, for errors
  std::string model_type;  // config.json's model_type: llama, mistral, qwen2, qwen3
  std::string arch;        // the GGUF architecture: llama (llama, mistral), qwen2, qwen3
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  bool head_dim_given = false;  // config.json names head_dim (then GGUF gets key/value_length)
  int64_t intermediate_size = 0;
  int64_t max_position_embeddings = 0;
  std::optional<int64_t> sliding_window;  // a window shorter than max_position_embeddings
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScalingConfig rope_scaling;
  bool tie_word_embeddings = false;
  bool exl2 = false;  // quantization_config.quant_method == "exl2"

  // llama and mistral checkpoints store q/k rows in rotate-half order, which llama.cpp's convert
  // permutes into the adjacent-pair order its (normal-style) RoPE reads; qwen2/qwen3 run NeoX-style
  // RoPE on the rows as stored.
  bool permutes_qk() const { return arch == "llama"; }
  // The context a model can run: max_position_embeddings, capped to the sliding window when there
  // is one (Vesper attends the whole context, so beyond the window outputs would differ; vLLM's
  // earlier releases capped the same way).
  int64_t context_length() const;
};

// Reads and validates DIR/config.json. Errors name the file and the field.
Result<HfConfig> read_config(const std::string& dir);

// The {arch}.* and general.* metadata of the GGUF conversion of this model.
std::vector<std::pair<std::string, gguf::Value>> model_metadata(const HfConfig& config,
                                                                const std::string& name);

// llama3 RoPE scaling as convert_hf_to_gguf.py writes it: one divisor per rotated dimension pair
// (the rope_freqs.weight tensor), head_dim / 2 values.
std::vector<float> llama3_rope_factors(const HfConfig& config);

}  // namespace vesper::hf
