#include "lora/adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error_text.h"
#include "core/fp16.h"
#include "core/json_nesting.h"
#include "core/mapped_file.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"
#include "tensor/quant.h"

namespace vesper::lora {
namespace fs = std::filesystem;
using model::kNumProjections;
using model::Projection;

const char* kind_name(AdapterKind kind) {
  return kind == AdapterKind::kVera ? "VeRA" : "LoRA";
}

namespace {

struct ProjectionName {
  Projection p;
  const char* gguf;  // blk.N.<gguf>.weight
  const char* hf;    // model.layers.N.<hf>
};
constexpr ProjectionName kProjectionNames[] = {
    {Projection::kQ, "attn_q", "self_attn.q_proj"},
    {Projection::kK, "attn_k", "self_attn.k_proj"},
    {Projection::kV, "attn_v", "self_attn.v_proj"},
    {Projection::kO, "attn_output", "self_attn.o_proj"},
    {Projection::kGate, "ffn_gate", "mlp.gate_proj"},
    {Projection::kUp, "ffn_up", "mlp.up_proj"},
    {Projection::kDown, "ffn_down", "mlp.down_proj"},
};

// A projection's (n_in, n_out) in the base model.
std::pair<int64_t, int64_t> projection_shape(const model::ModelConfig& c, Projection p) {
  switch (p) {
    case Projection::kQ:
      return {c.n_embd, c.q_dim()};
    case Projection::kK:
    case Projection::kV:
      return {c.n_embd, c.kv_dim()};
    case Projection::kO:
      return {c.q_dim(), c.n_embd};
    case Projection::kGate:
    case Projection::kUp:
      return {c.n_embd, c.n_ff};
    case Projection::kDown:
      return {c.n_ff, c.n_embd};
  }
  return {0, 0};
}

// q and k rows of a GGUF llama model are in rope order; a delta written in Hugging Face order
// reaches them through the per-head permutation (backend/low_rank.h).
int64_t hf_permutation(const model::ModelConfig& c, Projection p) {
  const bool rope_permuted = c.arch.rope_style == backend::RopeStyle::kNormal;
  return rope_permuted && (p == Projection::kQ || p == Projection::kK) ? c.head_dim : 0;
}

// Appends a tensor's elements (rows of `row_len`) to `data` as f32; returns their offset.
Result<int64_t> append_f32(std::vector<float>& data, tensor::GgmlType type, const void* src,
                           int64_t n, int64_t row_len, const std::string& where) {
  if (!tensor::can_dequantize(type) ||
      !(type == tensor::GgmlType::kF32 || type == tensor::GgmlType::kF16 ||
        type == tensor::GgmlType::kBF16 || type == tensor::GgmlType::kQ8_0))
    return make_error(where + " has type " + std::string(tensor::type_name(type)) +
                      "; adapter tensors must be f32, f16, bf16 or q8_0");
  const int64_t offset = static_cast<int64_t>(data.size());
  data.resize(data.size() + static_cast<size_t>(n));
  const size_t row_bytes = tensor::row_size(type, row_len);
  for (int64_t r = 0; r < n / row_len; ++r)
    tensor::dequantize_row(type, static_cast<const uint8_t*>(src) + r * row_bytes,
                           data.data() + offset + r * row_len, row_len);
  for (int64_t i = offset; i < static_cast<int64_t>(data.size()); ++i)
    if (!std::isfinite(data[static_cast<size_t>(i)]))
      return make_error(where + " holds a value that is not finite");
  return offset;
}

Status check_rank(int64_t rank, int64_t max_rank, const std::string& where) {
  if (rank > max_rank)
    return make_error(where + " has rank " + std::to_string(rank) + ", more than --max-lora-rank " +
                      std::to_string(max_rank));
  return {};
}

// ---- llama.cpp GGUF LoRA

Result<HostAdapter> read_gguf_lora(const std::string& path, const model::ModelConfig& c,
                                   int64_t max_rank, float user_scale, bool* recognized) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  VESPER_ASSIGN_OR_RETURN(const std::optional<std::string> type, file.get_string("general.type"));
  if (type != "adapter")
    return make_error(path + ": general.type is " + (type ? "\"" + *type + "\"" : "absent") +
                      ", not \"adapter\": this is not a LoRA adapter (a model file?)");
  *recognized = true;
  VESPER_ASSIGN_OR_RETURN(const std::optional<std::string> adapter_type,
                          file.get_string("adapter.type"));
  if (adapter_type != "lora")
    return make_error(path + ": adapter.type is " +
                      (adapter_type ? "\"" + *adapter_type + "\"" : "absent") +
                      "; Vesper reads \"lora\" GGUF adapters");
  VESPER_ASSIGN_OR_RETURN(const std::optional<std::string> arch,
                          file.get_string("general.architecture"));
  if (arch && *arch != c.arch.name)
    return make_error(path + ": the adapter is for architecture \"" + *arch +
                      "\" but the model is \"" + c.arch.name + "\"");
  VESPER_ASSIGN_OR_RETURN(const std::optional<double> alpha_value,
                          file.get_float("adapter.lora.alpha"));
  const double alpha = alpha_value.value_or(0.0);

  HostAdapter a;
  a.path = path;
  a.kind = AdapterKind::kLora;
  a.modules.resize(static_cast<size_t>(c.n_layer * kNumProjections));
  std::vector<bool> seen(a.modules.size() * 2, false);
  for (const gguf::TensorInfo& t : file.tensors()) {
    // blk.N.<proj>.weight.lora_a / lora_b
    const std::string where = path + ": tensor " + t.name;
    int64_t layer = -1;
    const ProjectionName* proj = nullptr;
    bool is_a = false;
    for (const ProjectionName& pn : kProjectionNames) {
      for (const bool a_side : {true, false}) {
        const std::string suffix =
            std::string(".") + pn.gguf + ".weight" + (a_side ? ".lora_a" : ".lora_b");
        if (t.name.size() > suffix.size() + 4 && t.name.rfind("blk.", 0) == 0 &&
            t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
          const std::string num = t.name.substr(4, t.name.size() - suffix.size() - 4);
          if (!num.empty() && num.size() < 6 &&
              std::all_of(num.begin(), num.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
            layer = std::stoll(num);
            proj = &pn;
            is_a = a_side;
          }
        }
      }
    }
    if (proj == nullptr)
      return make_error(where +
                        ": not a LoRA tensor of a layer projection (blk.N.{attn_q, attn_k, "
                        "attn_v, attn_output, ffn_gate, ffn_up, ffn_down}.weight.lora_a/_b)");
    if (layer >= c.n_layer)
      return make_error(where + ": layer " + std::to_string(layer) + " but the model has " +
                        std::to_string(c.n_layer));
    const auto [n_in, n_out] = projection_shape(c, proj->p);
    const size_t index =
        static_cast<size_t>(layer * kNumProjections + static_cast<int32_t>(proj->p));
    HostAdapter::Module& m = a.modules[index];
    if (t.shape.size() != 2)
      return make_error(where + " has shape " + shape_string(t.shape) + ", expected 2-D");
    const int64_t rank = is_a ? t.shape[1] : t.shape[0];
    const int64_t cols = is_a ? t.shape[0] : t.shape[1];
    const int64_t want = is_a ? n_in : n_out;
    if (cols != want || rank <= 0)
      return make_error(
          where + " has shape " + shape_string(t.shape) + ", expected [" +
          (is_a ? std::to_string(n_in) + ", rank" : "rank, " + std::to_string(n_out)) +
          "] for this model");
    VESPER_TRY(check_rank(rank, max_rank, where));
    if (m.rank != 0 && m.rank != rank)
      return make_error(where + " has rank " + std::to_string(rank) + " but its pair has rank " +
                        std::to_string(m.rank));
    if (seen[index * 2 + (is_a ? 0 : 1)]) return make_error(where + " appears twice");
    seen[index * 2 + (is_a ? 0 : 1)] = true;
    m.rank = rank;
    m.n_in = n_in;
    m.n_out = n_out;
    if (t.type != tensor::GgmlType::kF16) a.f16_exact = false;
    if (is_a) {
      VESPER_ASSIGN_OR_RETURN(m.a, append_f32(a.data, t.type, t.data, rank * n_in, n_in, where));
      m.a_stride = n_in;
    } else {
      VESPER_ASSIGN_OR_RETURN(m.b, append_f32(a.data, t.type, t.data, rank * n_out, rank, where));
      m.b_stride = rank;
    }
    // llama.cpp: scale * alpha / rank, or scale alone when the file has no alpha.
    m.scale = static_cast<float>(alpha != 0.0 ? user_scale * alpha / static_cast<double>(rank)
                                              : user_scale);
  }
  for (size_t i = 0; i < a.modules.size(); ++i) {
    if (seen[i * 2] != seen[i * 2 + 1]) {
      const int64_t layer = static_cast<int64_t>(i) / kNumProjections;
      const ProjectionName& pn = kProjectionNames[i % kNumProjections];
      return make_error(path + ": tensor blk." + std::to_string(layer) + "." + pn.gguf +
                        ".weight." + (seen[i * 2] ? "lora_b" : "lora_a") +
                        " is missing (its pair is present)");
    }
    a.max_rank = std::max(a.max_rank, a.modules[i].rank);
  }
  if (a.max_rank == 0) return make_error(path + ": the adapter has no LoRA tensors");
  return a;
}

// ---- PEFT (adapter_config.json + adapter_model.safetensors)

Result<nlohmann::json> read_json_file(const std::string& path) {
  // Mapped, not streamed: the open never blocks and the file must be a regular one.
  VESPER_ASSIGN_OR_RETURN(const MappedFile file, MappedFile::open(path));
  if (file.size() > (1u << 20))
    return make_error(path + ": larger than 1 MiB; not an adapter config");
  const std::string s(reinterpret_cast<const char*>(file.data()), file.size());
  if (find_json_nesting_over(s, 32) != std::string::npos)
    return make_error(path + ": JSON nested deeper than 32 levels");
  nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(path + ": not a JSON object");
  return j;
}

// The PEFT module name of a tensor: "base_model.model.model.layers.N.<hf module>.<rest>".
struct PeftName {
  int64_t layer = -1;
  const ProjectionName* proj = nullptr;
  std::string rest;  // after the module name: "lora_A.weight", "vera_lambda_b", ...
};
std::optional<PeftName> parse_peft_name(const std::string& name) {
  static const std::string prefix = "base_model.model.model.layers.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 6 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return std::nullopt;
  PeftName out;
  out.layer = std::stoll(name.substr(i, j - i));
  const std::string tail = name.substr(j + 1);
  for (const ProjectionName& pn : kProjectionNames) {
    const std::string hf = std::string(pn.hf) + ".";
    if (tail.rfind(hf, 0) == 0) {
      out.proj = &pn;
      out.rest = tail.substr(hf.size());
      return out;
    }
  }
  return std::nullopt;
}

Result<double> number_field(const nlohmann::json& j, const std::string& path, const char* key,
                            std::optional<double> fallback = std::nullopt) {
  if (!j.contains(key)) {
    if (fallback) return *fallback;
    return make_error(path + ": \"" + key + "\" is missing");
  }
  if (!j[key].is_number()) return make_error(path + ": \"" + key + "\" is not a number");
  return j[key].get<double>();
}

bool truthy(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

Result<HostAdapter> read_peft(const std::string& dir, const model::ModelConfig& c, int64_t max_rank,
                              float user_scale, bool* recognized) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  VESPER_ASSIGN_OR_RETURN(const nlohmann::json config, read_json_file(config_path));
  std::string peft_type = "LORA";
  if (config.contains("peft_type")) {
    if (!config["peft_type"].is_string())
      return make_error(config_path + ": \"peft_type\" is not a string");
    peft_type = config["peft_type"].get<std::string>();
  }
  if (peft_type != "LORA" && peft_type != "VERA")
    return make_error(config_path + ": \"peft_type\" is \"" + peft_type +
                      "\"; Vesper serves LORA and VERA adapters");
  const bool vera = peft_type == "VERA";
  *recognized = true;
  if (truthy(config, "use_dora"))
    return make_error(config_path + ": \"use_dora\" is true; DoRA adapters are not supported");
  if (truthy(config, "fan_in_fan_out"))
    return make_error(config_path +
                      ": \"fan_in_fan_out\" is true (Conv1D weights); a llama model's adapter "
                      "has it false");
  if (config.contains("bias") && config["bias"] != "none")
    return make_error(config_path + ": \"bias\" is " + config["bias"].dump() +
                      "; adapters that train biases are not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (config.contains(key) && !config[key].is_null() && !config[key].empty())
      return make_error(config_path + ": \"" + key +
                        "\" is set; per-module ranks and alphas are not supported yet");
  if (vera && config.contains("save_projection") && !truthy(config, "save_projection"))
    return make_error(config_path +
                      ": \"save_projection\" is false: the VeRA projections are not in the file "
                      "(regenerating them from projection_prng_key is not supported)");
  VESPER_ASSIGN_OR_RETURN(const double r_value, number_field(config, config_path, "r"));
  const auto r = static_cast<int64_t>(r_value);
  if (r <= 0 || static_cast<double>(r) != r_value)
    return make_error(config_path + ": \"r\" must be a positive integer");
  VESPER_TRY(check_rank(r, max_rank, config_path));
  double scale = user_scale;
  if (!vera) {
    VESPER_ASSIGN_OR_RETURN(const double alpha,
                            number_field(config, config_path, "lora_alpha", 8.0));
    scale = user_scale * (truthy(config, "use_rslora") ? alpha / std::sqrt(static_cast<double>(r))
                                                       : alpha / static_cast<double>(r));
  }
  VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsFile file,
                          gguf::SafetensorsFile::open(weights_path));

  HostAdapter a;
  a.path = dir;
  a.kind = vera ? AdapterKind::kVera : AdapterKind::kLora;
  a.f16_exact = !vera;  // VeRA's lambdas stay f32
  a.modules.resize(static_cast<size_t>(c.n_layer * kNumProjections));
  int64_t vera_a = -1, vera_b = -1, vera_in = 0, vera_out = 0;
  if (vera) {
    VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsTensor* ta, file.require("base_model.vera_A"));
    VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsTensor* tb, file.require("base_model.vera_B"));
    if (ta->shape.size() != 2 || ta->shape[0] != r)
      return make_error(weights_path + ": tensor base_model.vera_A has shape " +
                        shape_string(ta->shape) + ", expected [r = " + std::to_string(r) + ", in]");
    if (tb->shape.size() != 2 || tb->shape[1] != r)
      return make_error(weights_path + ": tensor base_model.vera_B has shape " +
                        shape_string(tb->shape) + ", expected [out, r = " + std::to_string(r) +
                        "]");
    vera_in = ta->shape[1];
    vera_out = tb->shape[0];
    VESPER_ASSIGN_OR_RETURN(vera_a, append_f32(a.data, ta->type, ta->data, r * vera_in, vera_in,
                                               weights_path + ": tensor base_model.vera_A"));
    VESPER_ASSIGN_OR_RETURN(vera_b, append_f32(a.data, tb->type, tb->data, vera_out * r, r,
                                               weights_path + ": tensor base_model.vera_B"));
  }
  // Which of a module's tensors were seen: bit 0 A / lambda_d, bit 1 B / lambda_b.
  std::vector<int> seen(a.modules.size(), 0);
  for (const gguf::SafetensorsTensor& t : file.tensors()) {
    if (vera && (t.name == "base_model.vera_A" || t.name == "base_model.vera_B")) continue;
    const std::string where = weights_path + ": tensor " + t.name;
    const std::optional<PeftName> name = parse_peft_name(t.name);
    const char* want_a = vera ? "vera_lambda_d" : "lora_A.weight";
    const char* want_b = vera ? "vera_lambda_b" : "lora_B.weight";
    if (!name || (name->rest != want_a && name->rest != want_b))
      return make_error(where + ": not a " + (vera ? "VeRA" : "LoRA") +
                        " tensor of a layer projection (base_model.model.model.layers.N.{"
                        "self_attn.q_proj, ..., mlp.down_proj}." +
                        want_a + " / " + want_b + ")");
    if (name->layer >= c.n_layer)
      return make_error(where + ": layer " + std::to_string(name->layer) + " but the model has " +
                        std::to_string(c.n_layer));
    const bool is_a = name->rest == want_a;
    if (t.type != tensor::GgmlType::kF16) a.f16_exact = false;
    const auto [n_in, n_out] = projection_shape(c, name->proj->p);
    const size_t index =
        static_cast<size_t>(name->layer * kNumProjections + static_cast<int32_t>(name->proj->p));
    if (seen[index] & (is_a ? 1 : 2)) return make_error(where + " appears twice");
    seen[index] |= is_a ? 1 : 2;
    HostAdapter::Module& m = a.modules[index];
    m.rank = r;
    m.n_in = n_in;
    m.n_out = n_out;
    m.scale = static_cast<float>(scale);
    m.permute_head_dim = hf_permutation(c, name->proj->p);
    if (vera) {
      const int64_t want = is_a ? r : n_out;
      if (t.shape.size() != 1 || t.shape[0] != want)
        return make_error(where + " has shape " + shape_string(t.shape) + ", expected [" +
                          std::to_string(want) + "]");
      if (n_in > vera_in || n_out > vera_out)
        return make_error(where + ": the module is [" + std::to_string(n_out) + " x " +
                          std::to_string(n_in) + "] but the shared vera_A / vera_B cover only [" +
                          std::to_string(vera_out) + " x " + std::to_string(vera_in) + "]");
      VESPER_ASSIGN_OR_RETURN(const int64_t off,
                              append_f32(a.data, t.type, t.data, want, want, where));
      (is_a ? m.lambda_d : m.lambda_b) = off;
      m.a = vera_a;
      m.a_stride = vera_in;
      m.b = vera_b;
      m.b_stride = r;
    } else {
      const std::vector<int64_t> want =
          is_a ? std::vector<int64_t>{r, n_in} : std::vector<int64_t>{n_out, r};
      if (t.shape != want)
        return make_error(where + " has shape " + shape_string(t.shape) + ", expected " +
                          shape_string(want) + " (r = " + std::to_string(r) + ")");
      const int64_t row = is_a ? n_in : r;
      VESPER_ASSIGN_OR_RETURN(const int64_t off, append_f32(a.data, t.type, t.data,
                                                            r * (is_a ? n_in : n_out), row, where));
      (is_a ? m.a : m.b) = off;
      (is_a ? m.a_stride : m.b_stride) = row;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] == 1 || seen[i] == 2) {
      const ProjectionName& pn = kProjectionNames[i % kNumProjections];
      const std::string missing = vera ? (seen[i] == 1 ? "vera_lambda_b" : "vera_lambda_d")
                                       : (seen[i] == 1 ? "lora_B.weight" : "lora_A.weight");
      return make_error(weights_path + ": tensor base_model.model.model.layers." +
                        std::to_string(static_cast<int64_t>(i) / kNumProjections) + "." + pn.hf +
                        "." + missing + " is missing (its pair is present)");
    }
    if (seen[i] == 0) a.modules[i] = HostAdapter::Module{};
  }
  a.max_rank = std::any_of(seen.begin(), seen.end(), [](int s) { return s == 3; }) ? r : 0;
  if (a.max_rank == 0) return make_error(weights_path + ": the adapter has no module tensors");
  return a;
}

}  // namespace

Result<HostAdapter> read_adapter(const std::string& path, const model::ModelConfig& config,
                                 int64_t max_rank, float scale, bool* recognized) {
  bool ignored = false;
  if (recognized == nullptr) recognized = &ignored;
  *recognized = false;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    if (!fs::exists(fs::path(path) / "adapter_config.json"))
      return make_error(path +
                        ": a directory without adapter_config.json (a PEFT adapter has "
                        "adapter_config.json and adapter_model.safetensors)");
    return read_peft(path, config, max_rank, scale, recognized);
  }
  if (!fs::exists(path, ec)) return make_error(path + ": no such adapter file or directory");
  return read_gguf_lora(path, config, max_rank, scale, recognized);
}

}  // namespace vesper::lora
