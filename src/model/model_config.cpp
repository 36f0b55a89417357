#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace vesper::model {
namespace {

const std::vector<ArchitectureTraits>& registry() {
  static const std::vector<ArchitectureTraits> kArchitectures = {
      {"llama", backend::RopeStyle::kNormal, false, false},
      {"qwen2", backend::RopeStyle::kNeox, true, false},
      {"qwen3", backend::RopeStyle::kNeox, false, true},
  };
  return kArchitectures;
}

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const auto& a : registry()) names.push_back(a.name);
  return names;
}

std::array<float, 2> ModelConfig::yarn_corr_dims() const {
  // The pair index at which a dimension completes `rotations` turns over the original context.
  const auto dim = [&](float rotations) {
    return static_cast<float>(rope_dims) *
           std::log(static_cast<float>(rope_original_context) /
                    (rotations * 2.0f * std::numbers::pi_v<float>)) /
           (2.0f * std::log(rope_freq_base));
  };
  return {std::max(0.0f, std::floor(dim(yarn_beta_fast))),
          std::min(static_cast<float>(rope_dims - 1), std::ceil(dim(yarn_beta_slow)))};
}

Result<ModelConfig> read_model_config(const gguf::GgufFile& file) {
  ModelConfig c;
  VESPER_ASSIGN_OR_RETURN(std::string arch, file.require_string("general.architecture"));
  const ArchitectureTraits* traits = nullptr;
  for (const auto& a : registry())
    if (a.name == arch) traits = &a;
  if (traits == nullptr) {
    std::string list;
    for (const auto& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
    return make_error(file.path() + ": architecture \"" + arch +
                      "\" is not supported; supported: " + list);
  }
  c.arch = *traits;
  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> name, file.get_string("general.name"));
  c.name = name.value_or(arch);

  const std::string p = arch + ".";
  auto positive = [&](const std::string& key, int64_t v) -> Status {
    if (v <= 0)
      return make_error(file.path() + ": metadata key \"" + key + "\" must be positive, got " +
                        std::to_string(v));
    return {};
  };
  VESPER_ASSIGN_OR_RETURN(c.n_embd, file.require_int(p + "embedding_length"));
  VESPER_TRY(positive(p + "embedding_length", c.n_embd));
  VESPER_ASSIGN_OR_RETURN(c.n_layer, file.require_int(p + "block_count"));
  VESPER_TRY(positive(p + "block_count", c.n_layer));
  VESPER_ASSIGN_OR_RETURN(c.n_ff, file.require_int(p + "feed_forward_length"));
  VESPER_TRY(positive(p + "feed_forward_length", c.n_ff));
  VESPER_ASSIGN_OR_RETURN(c.n_head, file.require_int(p + "attention.head_count"));
  VESPER_TRY(positive(p + "attention.head_count", c.n_head));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> n_head_kv,
                          file.get_int(p + "attention.head_count_kv"));
  c.n_head_kv = n_head_kv.value_or(c.n_head);
  VESPER_TRY(positive(p + "attention.head_count_kv", c.n_head_kv));
  if (c.n_head % c.n_head_kv != 0)
    return make_error(file.path() + ": attention.head_count " + std::to_string(c.n_head) +
                      " is not a multiple of attention.head_count_kv " +
                      std::to_string(c.n_head_kv));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> key_length,
                          file.get_int(p + "attention.key_length"));
  if (!key_length && c.n_embd % c.n_head != 0)
    return make_error(file.path() + ": embedding_length is not a multiple of attention.head_count");
  c.head_dim = key_length.value_or(c.n_embd / c.n_head);
  VESPER_TRY(positive(p + "attention.key_length", c.head_dim));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> value_length,
                          file.get_int(p + "attention.value_length"));
  if (value_length && *value_length != c.head_dim)
    return make_error(file.path() + ": attention.value_length " + std::to_string(*value_length) +
                      " differs from key_length " + std::to_string(c.head_dim) +
                      " (not supported)");
  VESPER_ASSIGN_OR_RETURN(c.context_length, file.require_int(p + "context_length"));
  VESPER_TRY(positive(p + "context_length", c.context_length));
  VESPER_ASSIGN_OR_RETURN(std::optional<double> eps,
                          file.get_float(p + "attention.layer_norm_rms_epsilon"));
  if (!eps)
    return make_error(file.path() + ": missing required metadata key \"" + p +
                      "attention.layer_norm_rms_epsilon\"");
  c.rms_eps = static_cast<float>(*eps);
  VESPER_ASSIGN_OR_RETURN(std::optional<double> base, file.get_float(p + "rope.freq_base"));
  c.rope_freq_base = static_cast<float>(base.value_or(10000.0));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> rope_dims,
                          file.get_int(p + "rope.dimension_count"));
  c.rope_dims = rope_dims.value_or(c.head_dim);
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    return make_error(file.path() + ": rope.dimension_count " + std::to_string(c.rope_dims) +
                      " must be even and at most the head size " + std::to_string(c.head_dim));

  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> scaling,
                          file.get_string(p + "rope.scaling.type"));
  VESPER_ASSIGN_OR_RETURN(std::optional<double> factor, file.get_float(p + "rope.scaling.factor"));
  if (!factor) {
    // Older files give the linear factor only as rope.scale_linear.
    VESPER_ASSIGN_OR_RETURN(factor, file.get_float(p + "rope.scale_linear"));
    if (factor && !scaling) scaling = "linear";
  }
  if (!scaling || *scaling == "none" || (factor && *factor == 1.0)) {
    c.rope_scaling = RopeScaling::kNone;
  } else if (*scaling == "linear") {
    if (!factor || *factor <= 0)
      return make_error(
          file.path() +
          ": rope.scaling.type is linear but rope.scaling.factor is missing or not positive");
    c.rope_scaling = RopeScaling::kLinear;
    c.rope_freq_scale = static_cast<float>(1.0 / *factor);
  } else if (*scaling == "yarn") {
    if (!factor || *factor <= 0)
      return make_error(
          file.path() +
          ": rope.scaling.type is yarn but rope.scaling.factor is missing or not positive");
    c.rope_scaling = RopeScaling::kYarn;
    c.rope_freq_scale = static_cast<float>(1.0 / *factor);
    VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                            file.get_int(p + "rope.scaling.original_context_length"));
    if (!original || *original <= 0)
      return make_error(file.path() +
                        ": rope.scaling.type is yarn but rope.scaling.original_context_length is "
                        "missing or not positive");
    c.rope_original_context = *original;
    const std::pair<const char*, float*> optional_floats[] = {
        {"rope.scaling.yarn_ext_factor", &c.yarn_ext_factor},
        {"rope.scaling.yarn_attn_factor", &c.yarn_attn_factor},
        {"rope.scaling.yarn_beta_fast", &c.yarn_beta_fast},
        {"rope.scaling.yarn_beta_slow", &c.yarn_beta_slow}};
    for (const auto& [key, value] : optional_floats) {
      VESPER_ASSIGN_OR_RETURN(std::optional<double> v, file.get_float(p + key));
      if (v) *value = static_cast<float>(*v);
    }
  } else if (*scaling == "llama3") {
    // llama3 scaling is carried by the rope_freqs.weight tensor (per-dimension divisors).
    c.rope_scaling = RopeScaling::kLlama3;
  } else {
    return make_error(file.path() + ": rope.scaling.type \"" + *scaling +
                      "\" is not supported; supported: none, linear, llama3, yarn");
  }

  VESPER_ASSIGN_OR_RETURN(const gguf::TensorInfo* embd, file.require_tensor("token_embd.weight"));
  if (embd->shape.size() != 2 || embd->shape[0] != c.n_embd)
    return make_error(file.path() + ": tensor token_embd.weight has shape " +
                      std::to_string(embd->shape[0]) + " x ... but embedding_length is " +
                      std::to_string(c.n_embd));
  c.n_vocab = embd->shape[1];
  return c;
}

}  // namespace vesper::model
