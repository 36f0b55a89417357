#include "hf/hf_config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numbers>

#include "core/json_file.h"

namespace vesper::hf {
namespace {

using nlohmann::json;

struct Architecture {
  const char* class_name;  // config.json "architectures"
  const char* model_type;  // config.json "model_type"
  const char* gguf_arch;
};

constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"MistralForCausalLM", "mistral", "llama"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
};

std::string supported_list() {
  std::string s;
  for (const Architecture& a : kArchitectures)
    s += (s.empty() ? "" : ", ") + std::string(a.class_name);
  return s;
}

// Typed access to config.json fields, with errors that name the file and the field.
class Fields {
 public:
  Fields(const std::string& path, const json& j) : path_(path), j_(j) {}

  Result<int64_t> positive(const char* key) const {
    VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> v, optional_int(key));
    if (!v) return make_error(path_ + ": missing field \"" + key + "\"");
    if (*v <= 0)
      return make_error(path_ + ": field \"" + key + "\" must be positive, got " +
                        std::to_string(*v));
    return *v;
  }
  Result<std::optional<int64_t>> optional_int(const char* key) const {
    if (!j_.contains(key) || j_[key].is_null()) return std::optional<int64_t>{};
    if (!j_[key].is_number_integer())
      return make_error(path_ + ": field \"" + key + "\" must be an integer");
    return std::optional<int64_t>{j_[key].get<int64_t>()};
  }
  Result<std::optional<double>> optional_number(const char* key) const {
    if (!j_.contains(key) || j_[key].is_null()) return std::optional<double>{};
    if (!j_[key].is_number()) return make_error(path_ + ": field \"" + key + "\" must be a number");
    return std::optional<double>{j_[key].get<double>()};
  }
  Result<bool> flag(const char* key, bool fallback) const {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_boolean())
      return make_error(path_ + ": field \"" + key + "\" must be true or false");
    return j_[key].get<bool>();
  }

 private:
  const std::string& path_;
  const json& j_;
};

Result<RopeScalingConfig> read_rope_scaling(const std::string& path, const json& j) {
  RopeScalingConfig r;
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return r;
  const json& s = j["rope_scaling"];
  if (!s.is_object())
    return make_error(path + ": field \"rope_scaling\" must be an object or null");
  // transformers names the kind "rope_type" (older files: "type").
  const char* type_key = s.contains("rope_type") ? "rope_type" : "type";
  if (!s.contains(type_key) || !s[type_key].is_string())
    return make_error(path + ": rope_scaling has no \"rope_type\"");
  r.type = s[type_key].get<std::string>();
  if (r.type == "default") {
    r.type = "none";
    return r;
  }
  if (r.type != "linear" && r.type != "llama3" && r.type != "yarn")
    return make_error(path + ": rope_scaling.rope_type \"" + r.type +
                      "\" is not supported; supported: linear, llama3, yarn");
  const Fields f(path, s);
  VESPER_ASSIGN_OR_RETURN(std::optional<double> factor, f.optional_number("factor"));
  if (!factor || *factor <= 0)
    return make_error(path + ": rope_scaling.factor must be a positive number");
  r.factor = *factor;
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                          f.optional_int("original_max_position_embeddings"));
  if (r.type == "llama3") {
    VESPER_ASSIGN_OR_RETURN(std::optional<double> low, f.optional_number("low_freq_factor"));
    VESPER_ASSIGN_OR_RETURN(std::optional<double> high, f.optional_number("high_freq_factor"));
    r.low_freq_factor = low.value_or(1.0);
    r.high_freq_factor = high.value_or(4.0);
    r.original_max_position_embeddings = original.value_or(8192);
    if (r.high_freq_factor <= r.low_freq_factor || r.original_max_position_embeddings <= 0)
      return make_error(path +
                        ": rope_scaling needs high_freq_factor > low_freq_factor and a positive "
                        "original_max_position_embeddings");
  }
  if (r.type == "yarn") {
    // The attention factor is transformers' default, 0.1 ln(factor) + 1 (what ggml's YaRN
    // applies); checkpoints that set it otherwise, or mscale, are not supported yet.
    for (const char* key : {"attention_factor", "mscale", "mscale_all_dim"})
      if (s.contains(key) && !s[key].is_null())
        return make_error(path + ": rope_scaling." + key + " is not supported for yarn");
    if (s.contains("truncate") && s["truncate"] == false)
      return make_error(path + ": rope_scaling.truncate false is not supported for yarn");
    VESPER_ASSIGN_OR_RETURN(std::optional<double> fast, f.optional_number("beta_fast"));
    VESPER_ASSIGN_OR_RETURN(std::optional<double> slow, f.optional_number("beta_slow"));
    r.beta_fast = fast.value_or(32.0);
    r.beta_slow = slow.value_or(1.0);
    r.original_max_position_embeddings =
        original.value_or(0);  // 0: the config's, filled by read_config
  }
  return r;
}

}  // namespace

int64_t HfConfig::context_length() const {
  return sliding_window ? std::min(max_position_embeddings, *sliding_window)
                        : max_position_embeddings;
}

Result<HfConfig> read_config(const std::string& dir) {
  HfConfig c;
  c.path = dir + "/config.json";
  VESPER_ASSIGN_OR_RETURN(const JsonFile file, read_json_file(c.path, true));
  const json& j = file.doc;

  // The architecture: "architectures"[0] when present, else "model_type".
  const Architecture* arch = nullptr;
  std::string named;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    named = j["architectures"][0].get<std::string>();
    for (const Architecture& a : kArchitectures)
      if (named == a.class_name) arch = &a;
  } else if (j.contains("model_type") && j["model_type"].is_string()) {
    named = j["model_type"].get<std::string>();
    for (const Architecture& a : kArchitectures)
      if (named == a.model_type) arch = &a;
  } else {
    return make_error(c.path +
                      ": names no architecture (neither \"architectures\" nor \"model_type\")");
  }
  if (arch == nullptr)
    return make_error(c.path + ": architecture \"" + named +
                      "\" is not supported; supported: " + supported_list());
  c.model_type = arch->model_type;
  c.arch = arch->gguf_arch;

  const Fields f(c.path, j);
  VESPER_ASSIGN_OR_RETURN(c.vocab_size, f.positive("vocab_size"));
  VESPER_ASSIGN_OR_RETURN(c.hidden_size, f.positive("hidden_size"));
  VESPER_ASSIGN_OR_RETURN(c.num_hidden_layers, f.positive("num_hidden_layers"));
  VESPER_ASSIGN_OR_RETURN(c.num_attention_heads, f.positive("num_attention_heads"));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads, f.optional_int("num_key_value_heads"));
  c.num_key_value_heads = kv_heads.value_or(c.num_attention_heads);
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0)
    return make_error(c.path + ": num_attention_heads " + std::to_string(c.num_attention_heads) +
                      " is not a multiple of num_key_value_heads " +
                      std::to_string(c.num_key_value_heads));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, f.optional_int("head_dim"));
  c.head_dim_given = head_dim.has_value();
  if (!head_dim && c.hidden_size % c.num_attention_heads != 0)
    return make_error(
        c.path +
        ": hidden_size is not a multiple of num_attention_heads and head_dim is not given");
  c.head_dim = head_dim.value_or(c.hidden_size / c.num_attention_heads);
  if (c.head_dim <= 0 || c.head_dim % 2 != 0)
    return make_error(c.path + ": head_dim " + std::to_string(c.head_dim) +
                      " must be positive and even");
  VESPER_ASSIGN_OR_RETURN(c.intermediate_size, f.positive("intermediate_size"));
  VESPER_ASSIGN_OR_RETURN(c.max_position_embeddings, f.positive("max_position_embeddings"));
  VESPER_ASSIGN_OR_RETURN(std::optional<double> eps, f.optional_number("rms_norm_eps"));
  c.rms_norm_eps = eps.value_or(1e-6);
  VESPER_ASSIGN_OR_RETURN(std::optional<double> theta, f.optional_number("rope_theta"));
  c.rope_theta = theta.value_or(10000.0);
  if (c.rms_norm_eps <= 0 || c.rope_theta <= 0)
    return make_error(c.path + ": rms_norm_eps and rope_theta must be positive");
  VESPER_ASSIGN_OR_RETURN(c.rope_scaling, read_rope_scaling(c.path, j));
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.original_max_position_embeddings == 0)
    c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  VESPER_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.flag("tie_word_embeddings", false));

  // Sliding-window attention: mistral whenever sliding_window is set, qwen2 only with
  // use_sliding_window (its configs carry a window they do not use).
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> window, f.optional_int("sliding_window"));
  VESPER_ASSIGN_OR_RETURN(bool use_window, f.flag("use_sliding_window", c.arch == "llama"));
  if (window && use_window && *window < c.max_position_embeddings) {
    if (*window <= 0) return make_error(c.path + ": field \"sliding_window\" must be positive");
    c.sliding_window = window;
  }

  if (c.arch == "llama") {
    VESPER_ASSIGN_OR_RETURN(bool bias, f.flag("attention_bias", false));
    VESPER_ASSIGN_OR_RETURN(bool mlp_bias, f.flag("mlp_bias", false));
    if (bias || mlp_bias)
      return make_error(c.path + ": attention_bias / mlp_bias are not supported for " + named);
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return make_error(c.path + ": hidden_act " + j["hidden_act"].dump() +
                      " is not supported; supported: silu");
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const json& q = j["quantization_config"];
    const std::string method = q.value("quant_method", std::string());
    if (method == "exl2") {
      c.exl2 = true;
    } else {
      return make_error(c.path + ": quantization_config.quant_method \"" + method +
                        "\" is not supported (load an unquantized checkpoint, or a GGUF)");
    }
  }
  return c;
}

std::vector<std::pair<std::string, gguf::Value>> model_metadata(const HfConfig& c,
                                                                const std::string& name) {
  using gguf::Value;
  const std::string p = c.arch + ".";
  std::vector<std::pair<std::string, Value>> m = {
      {"general.architecture", Value::string(c.arch)},
      {"general.name", Value::string(name)},
      {p + "vocab_size", Value::u32(static_cast<uint32_t>(c.vocab_size))},
      {p + "context_length", Value::u32(static_cast<uint32_t>(c.context_length()))},
      {p + "embedding_length", Value::u32(static_cast<uint32_t>(c.hidden_size))},
      {p + "block_count", Value::u32(static_cast<uint32_t>(c.num_hidden_layers))},
      {p + "feed_forward_length", Value::u32(static_cast<uint32_t>(c.intermediate_size))},
      {p + "attention.head_count", Value::u32(static_cast<uint32_t>(c.num_attention_heads))},
      {p + "attention.head_count_kv", Value::u32(static_cast<uint32_t>(c.num_key_value_heads))},
      {p + "rope.freq_base", Value::f32(static_cast<float>(c.rope_theta))},
      {p + "attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.rms_norm_eps))},
      {p + "rope.dimension_count", Value::u32(static_cast<uint32_t>(c.head_dim))},
  };
  if (c.head_dim_given) {
    m.emplace_back(p + "attention.key_length", Value::u32(static_cast<uint32_t>(c.head_dim)));
    m.emplace_back(p + "attention.value_length", Value::u32(static_cast<uint32_t>(c.head_dim)));
  }
  if (c.rope_scaling.type == "linear") {
    m.emplace_back(p + "rope.scaling.type", Value::string("linear"));
    m.emplace_back(p + "rope.scaling.factor",
                   Value::f32(static_cast<float>(c.rope_scaling.factor)));
  }
  if (c.rope_scaling.type == "yarn") {
    m.emplace_back(p + "rope.scaling.type", Value::string("yarn"));
    m.emplace_back(p + "rope.scaling.factor",
                   Value::f32(static_cast<float>(c.rope_scaling.factor)));
    m.emplace_back(
        p + "rope.scaling.original_context_length",
        Value::u32(static_cast<uint32_t>(c.rope_scaling.original_max_position_embeddings)));
    if (c.rope_scaling.beta_fast != 32.0)
      m.emplace_back(p + "rope.scaling.yarn_beta_fast",
                     Value::f32(static_cast<float>(c.rope_scaling.beta_fast)));
    if (c.rope_scaling.beta_slow != 1.0)
      m.emplace_back(p + "rope.scaling.yarn_beta_slow",
                     Value::f32(static_cast<float>(c.rope_scaling.beta_slow)));
  }
  // llama3 scaling travels as the rope_freqs.weight tensor, as convert_hf_to_gguf writes it.
  return m;
}

std::vector<float> llama3_rope_factors(const HfConfig& c) {
  const RopeScalingConfig& r = c.rope_scaling;
  const double low_freq_wavelen =
      static_cast<double>(r.original_max_position_embeddings) / r.low_freq_factor;
  const double high_freq_wavelen =
      static_cast<double>(r.original_max_position_embeddings) / r.high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < c.head_dim; i += 2) {
    // convert_hf_to_gguf computes the frequencies in float32.
    const float freq = 1.0f / std::pow(static_cast<float>(c.rope_theta),
                                       static_cast<float>(i) / static_cast<float>(c.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth =
          (static_cast<double>(r.original_max_position_embeddings) / wavelen - r.low_freq_factor) /
          (r.high_freq_factor - r.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return factors;
}

}  // namespace vesper::hf
