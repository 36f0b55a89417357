// MedusaHeads: Medusa's extra decoding heads (Cai et al. 2024), loaded from a directory holding
// the Medusa project's config.json and its heads' safetensors, and run on the target's backend.
//
// Head k reads h, the target's final hidden state (after the output norm) at a position t, and
// predicts the token at t + k + 2 (the target's own output row predicts t + 1):
//   x_0 = h;  x_{i+1} = x_i + SiLU(W_{k,i} x_i + b_{k,i})  for each of medusa_num_layers blocks;
//   logits_k = U_k x_L.
// Tensor names follow the Medusa project's `medusa_head` state dict: `{k}.{i}.linear.weight`
// ([hidden, hidden], torch [out, in]), `{k}.{i}.linear.bias` ([hidden]) and `{k}.{L}.weight`
// ([vocab, hidden]), optionally prefixed `medusa_head.`; F32, F16 or BF16.
//
// The heads' matrices are kept in `weight_type` (the type the target keeps its own output matrix
// in: a quantized target gets quantized heads, which then cost what its output matrix costs to
// read) when their rows fit its blocks, else as stored.
//
// load() checks everything against the target: config.json's medusa_num_heads, medusa_num_layers,
// hidden_size (the target's n_embd) and vocab_size (the target's), each tensor's presence and
// shape. Errors name the file and the field or tensor at fault.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/result.h"
#include "gguf/safetensors.h"

namespace vesper::spec {

// Where the heads of --speculative-model `path` are: a directory's config.json and its one
// .safetensors file (medusa_lm_head.safetensors when there are several), or a .safetensors file
// and the config.json beside it.
struct MedusaFiles {
  std::string config;
  std::string weights;
};
Result<MedusaFiles> locate_medusa_files(const std::string& path);
// config.json as a JSON object, or an error naming the file.
Result<nlohmann::json> read_medusa_config(const std::string& path);

class MedusaHeads {
 public:
  // `dir`: the directory (config.json and one .safetensors file; or the .safetensors file itself,
  // with config.json beside it).
  static Result<std::unique_ptr<MedusaHeads>> load(const std::string& dir,
                                                   backend::Backend& backend, int64_t n_embd,
                                                   int64_t n_vocab, tensor::GgmlType weight_type);
  ~MedusaHeads();
  MedusaHeads(const MedusaHeads&) = delete;
  MedusaHeads& operator=(const MedusaHeads&) = delete;

  int64_t num_heads() const { return static_cast<int64_t>(heads_.size()); }
  int64_t num_layers() const { return num_layers_; }
  int64_t n_embd() const { return n_embd_; }
  // Bytes of the heads' weights as kept (for the memory plan), and their type.
  int64_t weight_bytes() const { return weight_bytes_; }
  tensor::GgmlType weight_type() const { return weight_type_; }
  const std::string& path() const { return weights_path_; }

  // For each of the n hidden states (rows of n_embd floats) and each head, its `k` most likely
  // tokens, best first (ties: the lower id): out[(row * num_heads() + head) * k + rank].
  void top_k(std::span<const float> hidden, int64_t n, int64_t k, std::vector<int32_t>& out);
  // The same for rows `rows` of `hidden` (the target's hidden states where its forward pass left
  // them, Model::hidden_states), gathered on the device.
  void top_k(const backend::Tensor& hidden, std::span<const int32_t> rows, int64_t k,
             std::vector<int32_t>& out);

 private:
  MedusaHeads() = default;
  void reserve(int64_t rows);
  // Runs the heads over h_'s first n rows.
  void run_heads(int64_t n, int64_t k, std::vector<int32_t>& out);

  struct Head {
    std::vector<backend::WeightHandle> w;  // the residual blocks' matrices
    std::vector<backend::Tensor> b;        // and biases
    backend::WeightHandle out;             // the head's output matrix
  };
  backend::Backend* backend_ = nullptr;
  gguf::SafetensorsFile file_;
  std::string weights_path_;
  int64_t n_embd_ = 0, n_vocab_ = 0, num_layers_ = 1, weight_bytes_ = 0;
  std::vector<Head> heads_;
  std::deque<std::vector<float>> biases_;       // f32 copies the biases' backend constants use
  std::deque<std::vector<uint8_t>> converted_;  // matrices converted to weight_type_
  tensor::GgmlType weight_type_ = tensor::GgmlType::kF32;
  // Activations for up to capacity_ rows: the hidden states, two residual streams, ones (SiLU is
  // silu_mul by 1), the logits (host-visible).
  int64_t capacity_ = 0;
  backend::Tensor h_, x_, y_, ones_, logits_, rows_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace vesper::spec
