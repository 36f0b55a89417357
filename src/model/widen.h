// Widening a trained llama-family model into a larger one that computes exactly the same function:
// a benchmark input that is memory-bound like a real model (large matrices) yet gives a real
// model's output, so that speedups that depend on the model's predictions (speculative decoding)
// can be measured on wall-clock time (`vesper synth --widen-from`).
//
// Every matrix keeps its weights in its top-left corner, zeros elsewhere: extra attention heads
// (head size unchanged, as is the GQA ratio) and extra feed-forward units compute zeros, and the
// extra hidden dimensions stay zero because their norm weights are zero. RMSNorm then averages
// over more dimensions, so the real norm weights are scaled by sqrt(n_embd / new_n_embd) and the
// epsilon by n_embd / new_n_embd: normalisation is unchanged. Weights are quantized to `type`
// (zero blocks stay exactly zero).
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"
#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::model {

struct WidenSpec {
  int64_t n_embd = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_ff = 0;
  tensor::GgmlType type = tensor::GgmlType::kF32;
};

// Reads the llama model at `from`, writes the widened model to `out`. Errors name the file and
// the dimension that cannot be widened (smaller than the original, a different head size or
// GQA ratio).
Status widen_model(const std::string& from, const WidenSpec& spec, const std::string& out,
                   ThreadPool& pool);

}  // namespace vesper::model
