// Model quantization: rewrites a GGUF model with its weight matrices converted to a target type,
// following llama.cpp's defaults for which tensors stay at higher precision:
//  - 1-D tensors (norms, biases) stay as they are;
//  - output.weight becomes q6_K for 4/5-bit targets (q8_0 for q8_0, the target otherwise);
//  - a matrix whose row length is not a multiple of the target's block size falls back to a
//    32-block type (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, q2_K/q3_K -> q4_0), and to f16
//    when even that does not divide it.
// The metadata is copied with general.file_type and general.quantization_version updated.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/result.h"
#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::model {

struct QuantizeProgress {
  size_t index = 0;  // tensors done so far, 1-based after each
  size_t total = 0;
  std::string name;
  tensor::GgmlType from = tensor::GgmlType::kF32;
  tensor::GgmlType to = tensor::GgmlType::kF32;
};

// The type `vesper quantize --type target` gives tensor `name` of `shape` (ggml order).
tensor::GgmlType quantized_type_for(const std::string& name, const std::vector<int64_t>& shape,
                                    tensor::GgmlType current, tensor::GgmlType target);

// Target types `vesper quantize` accepts.
bool is_quantize_target(tensor::GgmlType type);

// Writes the model at `in_path` (a GGUF file or a Hugging Face checkpoint directory) to `out_path`
// as GGUF, its matrices converted to `target`; with no target every tensor keeps its type (what
// `vesper convert` does by default: a checkpoint's f32 / f16 / bf16 weights written as they are).
Status quantize_model(const std::string& in_path, const std::string& out_path,
                      std::optional<tensor::GgmlType> target, ThreadPool& pool,
                      const std::function<void(const QuantizeProgress&)>& progress = {});

}  // namespace vesper::model
