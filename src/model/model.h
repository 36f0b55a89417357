// Model: a llama-family transformer loaded from GGUF, its weights used in place from the
// mmap'd file, and one forward pass over a ForwardBatch that reads and writes a paged KvCache.
//
// The forward pass is batch-invariant: the logits of a row depend only on that row's token,
// position and context, never on the other rows of the batch or how a prompt was chunked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/kv_cache.h"
#include "backend/packed_weights.h"
#include "core/result.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "model/forward_batch.h"
#include "model/model_config.h"

namespace vesper::model {

// A weight matrix of n_out rows x n_in columns (GGUF shape [n_in, n_out]) in the mapping, and,
// for q4_0 / q8_0 / k-quant (q2_K ... q6_K) matrices with n_out a multiple of 8, the same weights
// repacked at load into 8-row interleaved chunks (backend/packed_weights.h) that matmul reads
// instead; the mapped pages of a packed matrix are then released and not touched again (except
// token_embd's rows when the output matrix is tied to it).
struct Weight {
  tensor::GgmlType type = tensor::GgmlType::kF32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  std::shared_ptr<const backend::PackedWeights> packed;  // null: matmul reads `data`
};

struct LayerWeights {
  const float* attn_norm = nullptr;
  Weight wq, wk, wv, wo;
  const float* bq = nullptr;  // qwen2 biases
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // qwen3 per-head norms
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;
  Weight w_gate, w_up, w_down;
};

struct ModelWeights {
  Weight token_embd;
  const float* output_norm = nullptr;
  Weight output;  // token_embd when the embeddings are tied
  const float* rope_freqs = nullptr;
  std::vector<LayerWeights> layers;
};

class Model {
 public:
  // Opens, validates and binds a GGUF model. Errors name the file and the fault.
  static Result<std::unique_ptr<Model>> load(const std::string& path);

  const ModelConfig& config() const { return config_; }
  const gguf::GgufFile& file() const { return file_; }
  const ModelWeights& weights() const { return weights_; }

  // The KV cache geometry this model needs for `n_blocks` blocks of `block_size` tokens.
  backend::KvCacheShape kv_shape(int64_t n_blocks, int64_t block_size) const;

  // Runs the batch. Writes logits for each of batch.logits_rows, in order, into `logits`
  // ([logits_rows.size() x n_vocab]). K/V of every batch token are stored at its slot.
  void forward(const ForwardBatch& batch, backend::KvCache& kv, float* logits, ThreadPool& pool);

 private:
  Model() = default;
  void reserve(int64_t num_tokens);

  gguf::GgufFile file_;
  ModelConfig config_;
  ModelWeights weights_;

  // Activation scratch, grown to the largest batch seen and reused.
  int64_t capacity_tokens_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_, tmp_, last_;
};

}  // namespace vesper::model
