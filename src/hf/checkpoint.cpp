#include "hf/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/logging.h"
#include "gguf/safetensors.h"
#include "hf/hf_config.h"
#include "hf/tensor_map.h"
#include "tensor/quant.h"
#include "tokenizer/hf_tokenizer.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
using gguf::Value;
using tensor::GgmlType;

// The mapped safetensors files and the tensors converted at load.
class CheckpointStorage final : public gguf::TensorStorage {
 public:
  std::vector<gguf::SafetensorsFile> files;
  std::deque<std::vector<uint8_t>> buffers;  // deque: buffers never move once made

  void release_pages(const void* p, size_t n) const override {
    for (const gguf::SafetensorsFile& f : files)
      f.mapping().release_pages(p, n);  // ignores other ranges
  }
  uint8_t* buffer(size_t bytes) { return buffers.emplace_back(bytes).data(); }
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(path + ": cannot read");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The safetensors files of the checkpoint: those model.safetensors.index.json names, else
// model.safetensors, else every *.safetensors in the directory.
Result<std::vector<std::string>> weight_files(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index)) {
    VESPER_ASSIGN_OR_RETURN(std::string text, read_text(index));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      return make_error(index + ": needs a \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        return make_error(index + ": weight_map[\"" + tensor + "\"] is not a file name");
      const std::string name = file.get<std::string>();
      if (name.find('/') != std::string::npos || name.starts_with("."))
        return make_error(index + ": weight_map names \"" + name + "\", which is not a file in " +
                          dir);
      names.insert(name);
    }
    for (const std::string& n : names) files.push_back(dir + "/" + n);
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back(dir + "/model.safetensors");
  } else {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file() && e.path().extension() == ".safetensors")
        files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  }
  if (files.empty())
    return make_error(dir + ": no model.safetensors (or *.safetensors shards) in the checkpoint");
  return files;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// llama.cpp's general.file_type for the matrices' dtype (all f32, mostly f16, mostly bf16).
uint32_t file_type_of(GgmlType type) {
  switch (type) {
    case GgmlType::kF16:
      return 1;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

Result<gguf::GgufFile> load_checkpoint(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.ends_with('/')) dir.pop_back();
  VESPER_ASSIGN_OR_RETURN(HfConfig config, read_config(dir));
  if (config.exl2)
    return make_error(config.path +
                      ": EXL2 checkpoints (quantization_config.quant_method exl2) "
                      "are not supported yet");

  if (config.sliding_window)
    log_warning(
        "%s: sliding_window %lld is shorter than max_position_embeddings %lld; the context is "
        "capped to the window (attention within it is exact)",
        config.path.c_str(), static_cast<long long>(*config.sliding_window),
        static_cast<long long>(config.max_position_embeddings));
  auto storage = std::make_shared<CheckpointStorage>();
  VESPER_ASSIGN_OR_RETURN(std::vector<std::string> paths, weight_files(dir));
  std::map<std::string, const gguf::SafetensorsTensor*, std::less<>> by_name;
  std::map<const gguf::SafetensorsTensor*, std::string> file_of;
  storage->files.reserve(paths.size());
  for (const std::string& p : paths) {
    VESPER_ASSIGN_OR_RETURN(gguf::SafetensorsFile f, gguf::SafetensorsFile::open(p));
    storage->files.push_back(std::move(f));
  }
  for (const gguf::SafetensorsFile& f : storage->files)
    for (const gguf::SafetensorsTensor& t : f.tensors()) {
      if (!by_name.emplace(t.name, &t).second)
        return make_error(f.path() + ": tensor " + t.name + " is also in " +
                          file_of[by_name[t.name]]);
      file_of[&t] = f.path();
    }

  std::vector<gguf::TensorInfo> tensors;
  std::set<std::string> used;
  GgmlType matrix_type = GgmlType::kF32;
  for (const ExpectedTensor& e : expected_tensors(config)) {
    auto it = by_name.find(e.hf_name);
    if (it == by_name.end()) {
      if (!e.required) continue;
      return make_error(dir + ": missing tensor " + e.hf_name + " (config.json describes a " +
                        config.model_type + " model with " +
                        std::to_string(config.num_hidden_layers) + " layers)");
    }
    const gguf::SafetensorsTensor& src = *it->second;
    used.insert(e.hf_name);
    if (!gguf::is_float_dtype(src.type))
      return make_error(file_of[&src] + ": tensor " + e.hf_name + " has dtype " +
                        std::string(gguf::safetensors_dtype_name(src.type)) +
                        ", expected F32, F16 or BF16");
    if (src.shape != e.shape)
      return make_error(file_of[&src] + ": tensor " + e.hf_name + " has shape " +
                        shape_string(src.shape) + ", config.json implies " + shape_string(e.shape));
    gguf::TensorInfo t;
    t.name = e.gguf_name;
    t.shape.assign(src.shape.rbegin(), src.shape.rend());
    t.type = src.type;
    t.size_bytes = src.size_bytes;
    t.data = src.data;
    if (e.conversion == Conversion::kToF32 && src.type != GgmlType::kF32) {
      auto* f32 = reinterpret_cast<float*>(storage->buffer(src.num_elements() * sizeof(float)));
      tensor::dequantize_row(src.type, src.data, f32, src.num_elements());
      t.type = GgmlType::kF32;
      t.size_bytes = src.num_elements() * sizeof(float);
      t.data = reinterpret_cast<const uint8_t*>(f32);
    } else if (e.conversion == Conversion::kPermuteQK) {
      uint8_t* rows = storage->buffer(src.size_bytes);
      permute_qk_rows(src.data, rows, e.heads, config.head_dim,
                      tensor::row_size(src.type, src.shape[1]));
      t.data = rows;
    }
    if (t.shape.size() == 2 && e.gguf_name != "token_embd.weight") matrix_type = t.type;
    tensors.push_back(std::move(t));
  }
  for (const auto& [name, t] : by_name)
    if (!used.contains(name) && !is_ignored_tensor(name) &&
        !(config.tie_word_embeddings && name == "lm_head.weight"))
      return make_error(file_of[t] + ": tensor " + name + " is not part of a " + config.model_type +
                        " model as config.json describes it");

  if (config.rope_scaling.type == "llama3") {
    const std::vector<float> factors = llama3_rope_factors(config);
    auto* data = storage->buffer(factors.size() * sizeof(float));
    std::memcpy(data, factors.data(), factors.size() * sizeof(float));
    gguf::TensorInfo t;
    t.name = "rope_freqs.weight";
    t.shape = {static_cast<int64_t>(factors.size())};
    t.size_bytes = factors.size() * sizeof(float);
    t.data = data;
    tensors.insert(tensors.begin() + 2, std::move(t));
  }

  std::vector<std::pair<std::string, Value>> metadata =
      model_metadata(config, fs::path(dir).filename().string());
  metadata.emplace_back("general.file_type", Value::u32(file_type_of(matrix_type)));
  if (fs::exists(dir + "/tokenizer.json")) {
    VESPER_ASSIGN_OR_RETURN(auto tokenizer, tokenizer::hf_tokenizer_metadata(dir));
    for (auto& kv : tokenizer) metadata.push_back(std::move(kv));
  }
  return gguf::GgufFile::assemble(dir, std::move(metadata), std::move(tensors), std::move(storage));
}

}  // namespace vesper::hf
