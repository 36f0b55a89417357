#include "spec/medusa_heads.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/quant.h"

namespace vesper::spec {
namespace {

namespace fs = std::filesystem;

// A positive integer field of the config, or an error naming the file and the field.
Result<int64_t> positive_field(const nlohmann::json& j, const std::string& file, const char* name) {
  if (!j.contains(name)) return make_error(file + ": no \"" + std::string(name) + "\"");
  if (!j[name].is_number_integer() || j[name].get<int64_t>() < 1)
    return make_error(file + ": \"" + std::string(name) + "\" must be a positive integer, got " +
                      j[name].dump());
  return j[name].get<int64_t>();
}

}  // namespace

Result<MedusaFiles> locate_medusa_files(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec) && fs::path(path).extension() == ".safetensors")
    return MedusaFiles{(fs::path(path).parent_path() / "config.json").string(), path};
  if (!fs::is_directory(path, ec))
    return make_error(path +
                      ": not a Medusa heads directory (config.json and a .safetensors file)");
  std::vector<std::string> weights;
  for (const auto& entry : fs::directory_iterator(path, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      weights.push_back(entry.path().string());
  std::sort(weights.begin(), weights.end());
  const std::string preferred = (fs::path(path) / "medusa_lm_head.safetensors").string();
  if (std::find(weights.begin(), weights.end(), preferred) != weights.end()) weights = {preferred};
  if (weights.empty()) return make_error(path + ": no .safetensors file with the Medusa heads");
  if (weights.size() > 1)
    return make_error(path + ": several .safetensors files (" + weights[0] + ", " + weights[1] +
                      "); name the heads' file in --speculative-model");
  return MedusaFiles{(fs::path(path) / "config.json").string(), weights[0]};
}

Result<nlohmann::json> read_medusa_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(path + ": cannot read the Medusa config");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object())
    return make_error(path + ": the Medusa config is not a JSON object");
  return config;
}

Result<std::unique_ptr<MedusaHeads>> MedusaHeads::load(const std::string& dir,
                                                       backend::Backend& backend, int64_t n_embd,
                                                       int64_t n_vocab,
                                                       tensor::GgmlType weight_type) {
  VESPER_ASSIGN_OR_RETURN(const MedusaFiles files, locate_medusa_files(dir));
  const std::string& config_path = files.config;
  const std::string& weights_path = files.weights;
  VESPER_ASSIGN_OR_RETURN(const nlohmann::json config, read_medusa_config(config_path));
  VESPER_ASSIGN_OR_RETURN(const int64_t num_heads,
                          positive_field(config, config_path, "medusa_num_heads"));
  int64_t num_layers = 1;
  if (config.contains("medusa_num_layers")) {
    VESPER_ASSIGN_OR_RETURN(num_layers, positive_field(config, config_path, "medusa_num_layers"));
  }
  if (num_heads > 64 || num_layers > 64)
    return make_error(config_path + ": " + std::to_string(num_heads) + " heads of " +
                      std::to_string(num_layers) +
                      " layers is more than Medusa heads have (at most 64 of each)");
  if (config.contains("hidden_size")) {
    VESPER_ASSIGN_OR_RETURN(const int64_t hidden,
                            positive_field(config, config_path, "hidden_size"));
    if (hidden != n_embd)
      return make_error(config_path + ": \"hidden_size\" " + std::to_string(hidden) +
                        " does not match the target model's n_embd " + std::to_string(n_embd));
  }
  if (config.contains("vocab_size")) {
    VESPER_ASSIGN_OR_RETURN(const int64_t vocab, positive_field(config, config_path, "vocab_size"));
    if (vocab != n_vocab)
      return make_error(config_path + ": \"vocab_size\" " + std::to_string(vocab) +
                        " does not match the target model's vocabulary of " +
                        std::to_string(n_vocab));
  }

  std::unique_ptr<MedusaHeads> m(new MedusaHeads());
  m->backend_ = &backend;
  m->weights_path_ = weights_path;
  m->n_embd_ = n_embd;
  m->n_vocab_ = n_vocab;
  m->num_layers_ = num_layers;
  VESPER_ASSIGN_OR_RETURN(m->file_, gguf::SafetensorsFile::open(weights_path));
  // Medusa's own checkpoints prefix the names with the module's; ours do not.
  const std::string prefix =
      m->file_.find("medusa_head.0.0.linear.weight") != nullptr ? "medusa_head." : "";
  auto tensor = [&](const std::string& name,
                    std::vector<int64_t> shape) -> Result<const gguf::SafetensorsTensor*> {
    VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsTensor* t, m->file_.require(prefix + name));
    if (!gguf::is_float_dtype(t->type))
      return make_error(weights_path + ": tensor " + prefix + name + " has dtype " +
                        std::string(gguf::safetensors_dtype_name(t->type)) +
                        ", expected F32, F16 or BF16");
    if (t->shape != shape) {
      auto dims = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      return make_error(weights_path + ": tensor " + prefix + name + " has shape " +
                        dims(t->shape) + ", expected " + dims(shape) + " (hidden_size " +
                        std::to_string(n_embd) + ", vocab " + std::to_string(n_vocab) + ")");
    }
    return t;
  };
  // Convert only into a type whose blocks the rows fill.
  const bool convert =
      tensor::can_quantize(weight_type) && n_embd % tensor::traits(weight_type).block_size == 0;
  auto weight = [&](const gguf::SafetensorsTensor* t, int64_t n_in,
                    int64_t n_out) -> Result<backend::WeightHandle> {
    backend::WeightSource src;
    src.type = t->type;
    src.data = t->data;
    src.n_in = n_in;
    src.n_out = n_out;
    if (convert && t->type != weight_type) {
      const size_t row_bytes = tensor::row_size(weight_type, n_in);
      std::vector<uint8_t>& bytes =
          m->converted_.emplace_back(row_bytes * static_cast<size_t>(n_out));
      std::vector<float> row(static_cast<size_t>(n_in));
      const size_t in_row = t->size_bytes / static_cast<size_t>(n_out);
      for (int64_t r = 0; r < n_out; ++r) {
        tensor::dequantize_row(t->type, t->data + static_cast<size_t>(r) * in_row, row.data(),
                               n_in);
        tensor::quantize_row(weight_type, row.data(),
                             bytes.data() + static_cast<size_t>(r) * row_bytes, n_in);
      }
      src.type = weight_type;
      src.data = bytes.data();
    }
    m->weight_bytes_ += static_cast<int64_t>(tensor::row_size(src.type, n_in)) * n_out;
    VESPER_ASSIGN_OR_RETURN(const backend::LoadedWeight loaded, backend.load_weight(src));
    return loaded.handle;
  };
  for (int64_t k = 0; k < num_heads; ++k) {
    Head head;
    const std::string base = std::to_string(k) + ".";
    for (int64_t i = 0; i < num_layers; ++i) {
      const std::string block = base + std::to_string(i) + ".linear.";
      VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsTensor* w,
                              tensor(block + "weight", {n_embd, n_embd}));
      VESPER_ASSIGN_OR_RETURN(const gguf::SafetensorsTensor* b, tensor(block + "bias", {n_embd}));
      VESPER_ASSIGN_OR_RETURN(const backend::WeightHandle wh, weight(w, n_embd, n_embd));
      head.w.push_back(wh);
      // backend constants live as long as their host copy: the heads keep it.
      std::vector<float>& bias = m->biases_.emplace_back(static_cast<size_t>(n_embd));
      tensor::dequantize_row(b->type, b->data, bias.data(), n_embd);
      head.b.push_back(backend.constant(bias.data(), n_embd));
    }
    VESPER_ASSIGN_OR_RETURN(
        const gguf::SafetensorsTensor* u,
        tensor(base + std::to_string(num_layers) + ".weight", {n_vocab, n_embd}));
    VESPER_ASSIGN_OR_RETURN(head.out, weight(u, n_embd, n_vocab));
    m->heads_.push_back(std::move(head));
  }
  // The stored type of the heads' matrices (the file's first tensor could be one they do not use).
  m->weight_type_ = convert ? weight_type : m->file_.find(prefix + "0.0.linear.weight")->type;
  return m;
}

MedusaHeads::~MedusaHeads() {
  for (backend::Tensor* t : {&h_, &x_, &y_, &ones_, &logits_, &rows_})
    if (t->buffer.valid()) backend_->release(t->buffer);
}

void MedusaHeads::reserve(int64_t rows) {
  if (rows <= capacity_) return;
  for (backend::Tensor* t : {&h_, &x_, &y_, &ones_, &logits_, &rows_})
    if (t->buffer.valid()) backend_->release(t->buffer);
  capacity_ = rows;
  using backend::DType;
  using backend::MemoryKind;
  h_ = backend_->allocate(DType::kF32, rows, n_embd_, MemoryKind::kDevice);
  x_ = backend_->allocate(DType::kF32, rows, n_embd_, MemoryKind::kDevice);
  y_ = backend_->allocate(DType::kF32, rows, n_embd_, MemoryKind::kDevice);
  ones_ = backend_->allocate(DType::kF32, rows, n_embd_, MemoryKind::kDevice);
  const std::vector<float> ones(static_cast<size_t>(rows * n_embd_), 1.0f);
  backend_->copy_to_device(ones_, ones.data());
  logits_ = backend_->allocate(DType::kF32, rows, n_vocab_, MemoryKind::kHostVisible);
  rows_ = backend_->allocate(DType::kI32, rows, 1, MemoryKind::kDevice);
}

void MedusaHeads::top_k(std::span<const float> hidden, int64_t n, int64_t k,
                        std::vector<int32_t>& out) {
  VESPER_CHECK(static_cast<int64_t>(hidden.size()) == n * n_embd_,
               "%zu floats for %lld hidden states", hidden.size(), static_cast<long long>(n));
  if (n > 0) {
    reserve(n);
    backend_->copy_to_device(h_.rows_view(0, n), hidden.data());
  }
  run_heads(n, k, out);
}

void MedusaHeads::top_k(const backend::Tensor& hidden, std::span<const int32_t> rows, int64_t k,
                        std::vector<int32_t>& out) {
  const auto n = static_cast<int64_t>(rows.size());
  if (n > 0) {
    reserve(n);
    backend_->copy_to_device(rows_.rows_view(0, n), rows.data());
    backend_->gather_rows(hidden, rows_.rows_view(0, n), h_.rows_view(0, n));
  }
  run_heads(n, k, out);
}

void MedusaHeads::run_heads(int64_t n, int64_t k, std::vector<int32_t>& out) {
  const int64_t heads = num_heads();
  out.assign(static_cast<size_t>(n * heads * k), 0);
  if (n == 0) return;
  k = std::min(k, n_vocab_);
  backend::Backend& b = *backend_;
  const backend::Tensor h = h_.rows_view(0, n), ones = ones_.rows_view(0, n);
  const backend::Tensor logits = logits_.rows_view(0, n);
  for (int64_t head = 0; head < heads; ++head) {
    const Head& hd = heads_[static_cast<size_t>(head)];
    // x = h, then x + SiLU(W x + b) per block, ping-ponging between x_ and y_ (h stays for the
    // next head).
    backend::Tensor x = h;
    for (int64_t i = 0; i < num_layers_; ++i) {
      const backend::Tensor next = (i % 2 == 0 ? x_ : y_).rows_view(0, n);
      b.matmul(hd.w[static_cast<size_t>(i)], x, next);
      b.add_bias(next, hd.b[static_cast<size_t>(i)]);
      b.silu_mul(next, ones);  // SiLU(u) * 1: exactly SiLU(u)
      b.add(next, x);
      x = next;
    }
    b.matmul(hd.out, x, logits);
    b.synchronize();
    const float* l = static_cast<const float*>(b.host_view(logits));
    for (int64_t r = 0; r < n; ++r) {
      scratch_.clear();
      for (int64_t t = 0; t < n_vocab_; ++t)
        scratch_.emplace_back(l[r * n_vocab_ + t], static_cast<int32_t>(t));
      auto better = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      };
      std::partial_sort(scratch_.begin(), scratch_.begin() + k, scratch_.end(), better);
      for (int64_t j = 0; j < k; ++j)
        out[static_cast<size_t>((r * heads + head) * k + j)] =
            scratch_[static_cast<size_t>(j)].second;
    }
  }
}

}  // namespace vesper::spec
