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

#include "core/error_text.h"
#include "core/json_file.h"
#include "core/logging.h"
#include "gguf/composite_weight.h"
#include "gguf/safetensors.h"
#include "hf/exl2_format.h"
#include "hf/exl2_repack.h"
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
  const uint8_t* keep(std::vector<uint8_t> bytes) {
    return buffers.emplace_back(std::move(bytes)).data();
  }
};

}  // namespace

Result<std::vector<std::string>> checkpoint_weight_files(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index)) {
    VESPER_ASSIGN_OR_RETURN(const JsonFile file, read_json_file(index, true));
    const nlohmann::json& j = file.doc;
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
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

namespace {

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
  if (config.sliding_window)
    log_warning(
        "%s: sliding_window %lld is shorter than max_position_embeddings %lld; the context is "
        "capped to the window (attention within it is exact)",
        config.path.c_str(), static_cast<long long>(*config.sliding_window),
        static_cast<long long>(config.max_position_embeddings));
  auto storage = std::make_shared<CheckpointStorage>();
  VESPER_ASSIGN_OR_RETURN(std::vector<std::string> paths, checkpoint_weight_files(dir));
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
  const TensorLookup lookup = lookup_in(storage->files, dir);
  for (const ExpectedTensor& e : expected_tensors(config)) {
    // An EXL2 layer (its q_weight marks it, also in files from before quantization_config):
    // repacked into exact integer parts (hf/exl2_repack.h).
    const std::string stem =
        e.hf_name.substr(0, e.hf_name.size() - std::string_view(".weight").size());
    if (e.hf_name.ends_with(".weight") && e.shape.size() == 2 &&
        by_name.contains(stem + ".q_weight")) {
      VESPER_ASSIGN_OR_RETURN(Exl2Layer layer,
                              read_exl2_layer(lookup, stem, e.shape[1], e.shape[0]));
      if (layer.bias != nullptr)
        return make_error(dir + ": EXL2 layer " + stem + " has a bias, which a " +
                          config.model_type + " model does not take");
      const std::vector<int32_t> output_order = e.conversion == Conversion::kPermuteQK
                                                    ? qk_row_order(e.heads, config.head_dim)
                                                    : std::vector<int32_t>();
      VESPER_ASSIGN_OR_RETURN(Exl2Repacked repacked, repack_exl2(layer, output_order));
      for (const char* part :
           {".q_weight", ".q_invperm", ".q_scale", ".q_scale_max", ".q_groups", ".q_perm"})
        used.insert(stem + part);
      gguf::TensorInfo order;
      order.name = gguf::composite_order_name(e.gguf_name);
      order.type = GgmlType::kI32;
      order.shape = {static_cast<int64_t>(repacked.input_order.size())};
      order.size_bytes = repacked.input_order.size() * sizeof(int32_t);
      uint8_t* order_data = storage->buffer(order.size_bytes);
      std::memcpy(order_data, repacked.input_order.data(), order.size_bytes);
      order.data = order_data;
      tensors.push_back(std::move(order));
      for (size_t i = 0; i < repacked.parts.size(); ++i) {
        Exl2Part& part = repacked.parts[i];
        gguf::TensorInfo t;
        t.name = gguf::composite_part_name(e.gguf_name, i);
        t.type = part.type;
        t.shape = {part.n_in, e.shape[0]};
        t.size_bytes = part.data.size();
        t.data = storage->keep(std::move(part.data));
        tensors.push_back(std::move(t));
      }
      continue;
    }
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
