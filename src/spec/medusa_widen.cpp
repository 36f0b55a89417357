#include "spec/medusa_widen.h"

#include <filesystem>
#include <fstream>

#include "gguf/safetensors.h"
#include "spec/medusa_heads.h"
#include "tensor/quant.h"

namespace vesper::spec {

Status widen_medusa(const std::string& from, int64_t n_embd, const std::string& out_dir) {
  VESPER_ASSIGN_OR_RETURN(const MedusaFiles files, locate_medusa_files(from));
  VESPER_ASSIGN_OR_RETURN(nlohmann::json config, read_medusa_config(files.config));
  VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsFile heads,
                          gguf::SafetensorsFile::open(files.weights));
  // The original hidden size: the config's, else a bias's length.
  int64_t old_embd = 0;
  if (config.contains("hidden_size") && config["hidden_size"].is_number_integer())
    old_embd = config["hidden_size"].get<int64_t>();
  for (const auto& t : heads.tensors())
    if (old_embd == 0 && t.name.ends_with(".linear.bias") && t.shape.size() == 1)
      old_embd = t.shape[0];
  if (old_embd <= 0)
    return make_error(files.config + ": no \"hidden_size\" (and no bias to tell it)");
  if (n_embd < old_embd)
    return make_error("--n-embd " + std::to_string(n_embd) +
                      " is smaller than the heads' hidden_size " + std::to_string(old_embd) + " (" +
                      files.config + ")");

  // Every tensor in F32 with each hidden-size dimension padded (top-left corner, zeros elsewhere).
  std::vector<std::vector<float>> storage;
  std::vector<gguf::SafetensorsTensorData> out;
  for (const gguf::SafetensorsTensor& t : heads.tensors()) {
    if (!gguf::is_float_dtype(t.type))
      return make_error(files.weights + ": tensor " + t.name + " has dtype " +
                        std::string(gguf::safetensors_dtype_name(t.type)) +
                        ", expected F32, F16 or BF16");
    if (t.shape.empty() || t.shape.size() > 2)
      return make_error(files.weights + ": tensor " + t.name + " is not a vector or a matrix");
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1, cols = t.shape.back();
    const int64_t new_rows = t.shape.size() == 2 && rows == old_embd ? n_embd : rows;
    const int64_t new_cols = cols == old_embd ? n_embd : cols;
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<float>& padded =
        storage.emplace_back(static_cast<size_t>(new_rows * new_cols), 0.0f);
    const size_t row_bytes = t.size_bytes / static_cast<size_t>(rows);
    for (int64_t r = 0; r < rows; ++r) {
      tensor::dequantize_row(t.type, t.data + static_cast<size_t>(r) * row_bytes, row.data(), cols);
      std::copy(row.begin(), row.end(), padded.begin() + r * new_cols);
    }
    std::vector<int64_t> shape = t.shape;
    if (shape.size() == 2) shape[0] = new_rows;
    shape.back() = new_cols;
    out.push_back({t.name, tensor::GgmlType::kF32, shape, padded.data()});
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return make_error(out_dir + ": cannot create the directory (" + ec.message() + ")");
  const std::string weights =
      (std::filesystem::path(out_dir) / std::filesystem::path(files.weights).filename()).string();
  VESPER_TRY(gguf::write_safetensors(weights, out));
  config["hidden_size"] = n_embd;
  const std::string config_path = (std::filesystem::path(out_dir) / "config.json").string();
  std::ofstream c(config_path, std::ios::trunc);
  c << config.dump(1) << "\n";
  if (!c.flush()) return make_error(config_path + ": cannot write");
  return {};
}

}  // namespace vesper::spec
