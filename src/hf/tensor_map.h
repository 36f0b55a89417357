// The tensors of a Hugging Face checkpoint of a supported architecture: for each, its GGUF name,
// the shape config.json implies, and what the GGUF conversion does to it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hf/hf_config.h"

namespace vesper::hf {

enum class Conversion {
  kAsStored,   // zero-copy, in the stored dtype
  kToF32,      // norms and biases: widened to f32
  kPermuteQK,  // llama q_proj / k_proj: rows from rotate-half into adjacent-pair order
};

struct ExpectedTensor {
  std::string hf_name;
  std::string gguf_name;
  std::vector<int64_t> shape;  // torch order, as safetensors stores it
  Conversion conversion = Conversion::kAsStored;
  int64_t heads = 0;  // kPermuteQK: the heads the rows form
  bool required = true;
};

// Every tensor a checkpoint of `config` holds, in the order the GGUF gets them. lm_head is
// optional (absent: the embeddings are tied, as convert_hf_to_gguf.py assumes).
std::vector<ExpectedTensor> expected_tensors(const HfConfig& config);

// Tensors a checkpoint may carry that no model reads (rotary_emb.inv_freq of older exports).
bool is_ignored_tensor(const std::string& hf_name);

// llama.cpp's order of a q/k projection's rows: order[r] is the stored row that row r takes
// (row 2j + i of a head is row i * head_dim / 2 + j of the head as stored, rotate-half order).
std::vector<int32_t> qk_row_order(int64_t heads, int64_t head_dim);

// Writes the rows of a q/k projection ([heads * head_dim] rows of `row_bytes`) into `dst` in
// qk_row_order.
void permute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t heads, int64_t head_dim,
                     size_t row_bytes);

}  // namespace vesper::hf
