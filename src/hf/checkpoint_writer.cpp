#include "hf/checkpoint_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/safetensors.h"
#include "hf/hf_config.h"
#include "hf/tensor_map.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct ArchNames {
  const char* gguf_arch;
  const char* class_name;
};
constexpr ArchNames kArchNames[] = {
    {"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"}};

// Reads {arch}.<key> as an integer, or the error naming the file and the key.
Result<int64_t> required_int(const gguf::GgufFile& f, const std::string& key) {
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.get_int(key));
  if (!v) return make_error(f.path() + ": " + key + " is missing");
  return *v;
}

// config.json for the model `f` describes.
Result<ordered_json> config_of(const gguf::GgufFile& f) {
  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> arch, f.get_string("general.architecture"));
  const ArchNames* names = nullptr;
  for (const ArchNames& a : kArchNames)
    if (arch && *arch == a.gguf_arch) names = &a;
  if (names == nullptr)
    return make_error(f.path() + ": general.architecture \"" + arch.value_or("") +
                      "\" cannot be written as a checkpoint (llama, qwen2 or qwen3)");
  const std::string a = *arch + ".";
  ordered_json c;
  c["architectures"] = {names->class_name};
  c["model_type"] = *arch;
  VESPER_ASSIGN_OR_RETURN(const gguf::TensorInfo* embd, f.require_tensor("token_embd.weight"));
  if (embd->shape.size() != 2) return make_error(f.path() + ": token_embd.weight is not a matrix");
  c["vocab_size"] = embd->shape[1];
  VESPER_ASSIGN_OR_RETURN(const int64_t n_embd, required_int(f, a + "embedding_length"));
  VESPER_ASSIGN_OR_RETURN(const int64_t n_head, required_int(f, a + "attention.head_count"));
  c["hidden_size"] = n_embd;
  VESPER_ASSIGN_OR_RETURN(c["intermediate_size"], required_int(f, a + "feed_forward_length"));
  VESPER_ASSIGN_OR_RETURN(c["num_hidden_layers"], required_int(f, a + "block_count"));
  c["num_attention_heads"] = n_head;
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> n_head_kv,
                          f.get_int(a + "attention.head_count_kv"));
  c["num_key_value_heads"] = n_head_kv.value_or(n_head);
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> key_length, f.get_int(a + "attention.key_length"));
  const int64_t head_dim = key_length.value_or(n_embd / n_head);
  if (key_length || *arch == "qwen3") c["head_dim"] = head_dim;
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> rope_dims, f.get_int(a + "rope.dimension_count"));
  if (rope_dims && *rope_dims != head_dim)
    return make_error(f.path() + ": " + a + "rope.dimension_count " + std::to_string(*rope_dims) +
                      " (partial rotary) has no config.json field here");
  VESPER_ASSIGN_OR_RETURN(c["max_position_embeddings"], required_int(f, a + "context_length"));
  VESPER_ASSIGN_OR_RETURN(std::optional<double> eps,
                          f.get_float(a + "attention.layer_norm_rms_epsilon"));
  c["rms_norm_eps"] = eps.value_or(1e-5);
  VESPER_ASSIGN_OR_RETURN(std::optional<double> theta, f.get_float(a + "rope.freq_base"));
  c["rope_theta"] = theta.value_or(10000.0);
  VESPER_ASSIGN_OR_RETURN(std::optional<std::string> scaling,
                          f.get_string(a + "rope.scaling.type"));
  if (scaling && *scaling == "linear") {
    VESPER_ASSIGN_OR_RETURN(std::optional<double> factor, f.get_float(a + "rope.scaling.factor"));
    c["rope_scaling"] = {{"type", "linear"}, {"factor", factor.value_or(1.0)}};
  } else if (scaling && *scaling != "none") {
    return make_error(f.path() + ": " + a + "rope.scaling.type \"" + *scaling +
                      "\" is not written to config.json here (linear only)");
  } else {
    c["rope_scaling"] = nullptr;
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr)
    return make_error(f.path() +
                      ": tensor rope_freqs.weight (llama3 RoPE factors) has no "
                      "config.json form here");
  c["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> bos, f.get_int("tokenizer.ggml.bos_token_id"));
  VESPER_ASSIGN_OR_RETURN(std::optional<int64_t> eos, f.get_int("tokenizer.ggml.eos_token_id"));
  if (bos) c["bos_token_id"] = *bos;
  if (eos) c["eos_token_id"] = *eos;
  c["torch_dtype"] = embd->type == tensor::GgmlType::kBF16  ? "bfloat16"
                     : embd->type == tensor::GgmlType::kF32 ? "float32"
                                                            : "float16";
  return c;
}

Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  if (!out || !(out << text) || !out.flush()) return make_error(path + ": cannot write");
  return {};
}

}  // namespace

Status write_checkpoint(const gguf::GgufFile& model, const std::string& dir,
                        const std::string& tokenizer_from) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(dir + ": cannot create the directory: " + ec.message());
  VESPER_ASSIGN_OR_RETURN(ordered_json config_json, config_of(model));
  VESPER_TRY(write_text(dir + "/config.json", config_json.dump(2) + "\n"));
  // The tensor list is the loader's own (read back from the config just written), so what is
  // written is exactly what load_checkpoint expects.
  VESPER_ASSIGN_OR_RETURN(const HfConfig config, read_config(dir));
  std::vector<gguf::SafetensorsTensorData> tensors;
  std::vector<std::vector<uint8_t>> permuted;  // q/k rows back in rotate-half order
  permuted.reserve(2 * static_cast<size_t>(config.num_hidden_layers));
  for (const ExpectedTensor& e : expected_tensors(config)) {
    const gguf::TensorInfo* t = model.find_tensor(e.gguf_name);
    if (t == nullptr) {
      if (!e.required) continue;
      return make_error(model.path() + ": tensor " + e.gguf_name + " is missing");
    }
    if (!gguf::is_float_dtype(t->type))
      return make_error(model.path() + ": tensor " + e.gguf_name + " is " +
                        std::string(tensor::type_name(t->type)) +
                        "; a checkpoint holds f32, f16 or bf16 weights");
    std::vector<int64_t> torch_shape(t->shape.rbegin(), t->shape.rend());
    if (torch_shape != e.shape)
      return make_error(model.path() + ": tensor " + e.gguf_name +
                        " does not have the shape its metadata implies");
    const void* data = t->data;
    if (e.conversion == Conversion::kPermuteQK) {
      // The loader takes GGUF row r from stored row order[r]; put each row back there.
      const size_t row = t->size_bytes / static_cast<size_t>(t->rows());
      const std::vector<int32_t> order = qk_row_order(e.heads, config.head_dim);
      std::vector<uint8_t>& out = permuted.emplace_back(t->size_bytes);
      for (size_t r = 0; r < order.size(); ++r)
        std::memcpy(out.data() + static_cast<size_t>(order[r]) * row, t->data + r * row, row);
      data = out.data();
    }
    tensors.push_back({e.hf_name, t->type, torch_shape, data});
  }
  VESPER_TRY(gguf::write_safetensors(dir + "/model.safetensors", tensors));
  if (!tokenizer_from.empty()) {
    if (!fs::exists(tokenizer_from + "/tokenizer.json"))
      return make_error(tokenizer_from + ": has no tokenizer.json to copy");
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
      const fs::path from = fs::path(tokenizer_from) / name;
      if (!fs::exists(from)) continue;
      const fs::path to = fs::path(dir) / name;
      fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
      if (ec) return make_error(from.string() + ": cannot copy: " + ec.message());
      // The copy is the checkpoint's own file, writable whatever the donor's mode.
      fs::permissions(to, fs::perms::owner_write, fs::perm_options::add, ec);
    }
  }
  return {};
}

}  // namespace vesper::hf
