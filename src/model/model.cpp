#include "model/model.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "backend/matmul.h"
#include "backend/ops.h"
#include "backend/paged_attention.h"
#include "tensor/quant.h"

namespace vesper::model {
namespace {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class Binder {
 public:
  explicit Binder(const gguf::GgufFile& file) : file_(file) {}

  const gguf::TensorInfo* find(const std::string& name) const { return file_.find_tensor(name); }

  Result<Weight> matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
    VESPER_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, file_.require_tensor(name));
    return matrix_from(t, n_in, n_out);
  }

  Result<Weight> matrix_from(const gguf::TensorInfo* t, int64_t n_in, int64_t n_out) const {
    if (t->shape.size() != 2 || t->shape[0] != n_in || t->shape[1] != n_out)
      return make_error(file_.path() + ": tensor " + t->name + " has shape " +
                        shape_string(t->shape) + ", expected [" + std::to_string(n_in) + ", " +
                        std::to_string(n_out) + "]");
    if (!backend::matmul_supported(t->type))
      return make_error(file_.path() + ": tensor " + t->name + " has type " +
                        std::string(tensor::type_name(t->type)) +
                        ", which Vesper cannot compute with yet");
    Weight w{t->type, t->data, n_in, n_out, nullptr};
    if (backend::packable(t->type, n_in, n_out)) {
      w.packed = std::make_shared<const backend::PackedWeights>(
          backend::prepare_weights(t->type, t->data, n_in, n_out));
      // The packed copy replaces the mapped bytes, so their pages need not stay resident (peak
      // memory stays about the file size). token_embd's stay: get_rows reads its rows.
      if (t->name != "token_embd.weight")
        file_.mapping().release_pages(t->data, tensor::row_size(t->type, n_in) * n_out);
    }
    return w;
  }

  // A 1-D f32 vector (norm weights, biases).
  Result<const float*> vector(const std::string& name, int64_t n, bool required = true) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) {
      if (!required) return static_cast<const float*>(nullptr);
      return make_error(file_.path() + ": missing required tensor \"" + name + "\"");
    }
    if (t->num_elements() != n || t->shape[0] != n)
      return make_error(file_.path() + ": tensor " + name + " has shape " + shape_string(t->shape) +
                        ", expected [" + std::to_string(n) + "]");
    if (t->type != tensor::GgmlType::kF32)
      return make_error(file_.path() + ": tensor " + name + " has type " +
                        std::string(tensor::type_name(t->type)) + ", expected f32");
    return reinterpret_cast<const float*>(t->data);
  }

 private:
  const gguf::GgufFile& file_;
};

}  // namespace

Result<std::unique_ptr<Model>> Model::load(const std::string& path) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(path));
  VESPER_ASSIGN_OR_RETURN(ModelConfig config, read_model_config(file));
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  m->config_ = config;
  const ModelConfig& c = m->config_;
  Binder bind(m->file_);
  ModelWeights& w = m->weights_;

  const gguf::TensorInfo* embd = m->file_.find_tensor("token_embd.weight");
  if (!tensor::traits(embd->type).supported)
    return make_error(path + ": tensor token_embd.weight has unsupported type " +
                      std::string(tensor::type_name(embd->type)));
  w.token_embd = Weight{embd->type, embd->data, c.n_embd, c.n_vocab, nullptr};
  VESPER_ASSIGN_OR_RETURN(w.output_norm, bind.vector("output_norm.weight", c.n_embd));
  if (const gguf::TensorInfo* out = bind.find("output.weight")) {
    VESPER_ASSIGN_OR_RETURN(w.output, bind.matrix_from(out, c.n_embd, c.n_vocab));
  } else {
    VESPER_ASSIGN_OR_RETURN(w.output, bind.matrix_from(embd, c.n_embd, c.n_vocab));  // tied
  }
  VESPER_ASSIGN_OR_RETURN(w.rope_freqs, bind.vector("rope_freqs.weight", c.rope_dims / 2, false));

  w.layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    VESPER_ASSIGN_OR_RETURN(l.attn_norm, bind.vector(p + "attn_norm.weight", c.n_embd));
    VESPER_ASSIGN_OR_RETURN(l.wq, bind.matrix(p + "attn_q.weight", c.n_embd, c.q_dim()));
    VESPER_ASSIGN_OR_RETURN(l.wk, bind.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim()));
    VESPER_ASSIGN_OR_RETURN(l.wv, bind.matrix(p + "attn_v.weight", c.n_embd, c.kv_dim()));
    VESPER_ASSIGN_OR_RETURN(l.wo, bind.matrix(p + "attn_output.weight", c.q_dim(), c.n_embd));
    const bool bias = c.arch.qkv_bias;
    VESPER_ASSIGN_OR_RETURN(l.bq, bind.vector(p + "attn_q.bias", c.q_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.bk, bind.vector(p + "attn_k.bias", c.kv_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.bv, bind.vector(p + "attn_v.bias", c.kv_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.q_norm,
                            bind.vector(p + "attn_q_norm.weight", c.head_dim, c.arch.qk_norm));
    VESPER_ASSIGN_OR_RETURN(l.k_norm,
                            bind.vector(p + "attn_k_norm.weight", c.head_dim, c.arch.qk_norm));
    VESPER_ASSIGN_OR_RETURN(l.ffn_norm, bind.vector(p + "ffn_norm.weight", c.n_embd));
    VESPER_ASSIGN_OR_RETURN(l.w_gate, bind.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff));
    VESPER_ASSIGN_OR_RETURN(l.w_up, bind.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff));
    VESPER_ASSIGN_OR_RETURN(l.w_down, bind.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd));
  }
  return m;
}

backend::KvCacheShape Model::kv_shape(int64_t n_blocks, int64_t block_size) const {
  return backend::KvCacheShape{config_.n_layer, n_blocks, block_size, config_.n_head_kv,
                               config_.head_dim};
}

void Model::reserve(int64_t n) {
  if (n <= capacity_tokens_) return;
  const ModelConfig& c = config_;
  x_.resize(n * c.n_embd);
  xn_.resize(n * c.n_embd);
  q_.resize(n * c.q_dim());
  k_.resize(n * c.kv_dim());
  v_.resize(n * c.kv_dim());
  attn_.resize(n * c.q_dim());
  gate_.resize(n * c.n_ff);
  up_.resize(n * c.n_ff);
  tmp_.resize(n * c.n_embd);
  last_.resize(n * c.n_embd);
  capacity_tokens_ = n;
}

namespace {
void matmul(const Weight& w, const float* x, int64_t rows, float* y, ThreadPool& pool) {
  if (w.packed != nullptr) {
    backend::matmul(*w.packed, x, rows, y, pool);
  } else {
    backend::matmul(w.type, w.data, w.n_in, w.n_out, x, rows, y, pool);
  }
}

// The products of several weights that read the same input, as one job on the pool
// (backend::matmul_group: the same bits as one matmul each).
void matmul_shared_input(std::initializer_list<std::pair<const Weight*, float*>> products,
                         const float* x, int64_t rows, ThreadPool& pool) {
  backend::MatmulTarget targets[backend::kMaxMatmulGroup];
  int n = 0;
  int64_t n_in = 0;
  for (const auto& [w, y] : products) {
    targets[n++] = backend::MatmulTarget{w->packed.get(), w->type, w->data, w->n_out, y};
    n_in = w->n_in;
  }
  backend::matmul_group(targets, n, n_in, x, rows, pool);
}
}  // namespace

void Model::forward(const ForwardBatch& batch, backend::KvCache& kv, float* logits,
                    ThreadPool& pool) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  if (n == 0) return;
  reserve(n);
  const int64_t d = c.n_embd;

  backend::get_rows(weights_.token_embd.type, weights_.token_embd.data, d, batch.token_ids.data(),
                    n, x_.data());

  backend::AttentionBatch ab;
  ab.num_tokens = n;
  ab.positions = batch.positions.data();
  ab.token_seq = batch.token_seq.data();
  ab.slot_mapping = batch.slot_mapping.data();
  ab.block_tables = batch.block_tables.data();
  ab.table_offsets = batch.table_offsets.data();

  backend::RopeParams rope;
  rope.style = c.arch.rope_style;
  rope.rope_dims = c.rope_dims;
  rope.freq_base = c.rope_freq_base;
  rope.freq_scale = c.rope_freq_scale;
  rope.freq_factors = weights_.rope_freqs;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = weights_.layers[il];
    backend::rms_norm(x_.data(), l.attn_norm, d, n, c.rms_eps, xn_.data());
    matmul_shared_input({{&l.wq, q_.data()}, {&l.wk, k_.data()}, {&l.wv, v_.data()}}, xn_.data(), n,
                        pool);
    if (l.bq != nullptr) backend::add_bias(q_.data(), l.bq, c.q_dim(), n);
    if (l.bk != nullptr) backend::add_bias(k_.data(), l.bk, c.kv_dim(), n);
    if (l.bv != nullptr) backend::add_bias(v_.data(), l.bv, c.kv_dim(), n);
    if (l.q_norm != nullptr)
      backend::rms_norm_heads(q_.data(), l.q_norm, c.head_dim, n, c.n_head, c.rms_eps);
    if (l.k_norm != nullptr)
      backend::rms_norm_heads(k_.data(), l.k_norm, c.head_dim, n, c.n_head_kv, c.rms_eps);
    // One pass for Q and K: each row's rotation angles are computed once for both.
    backend::rope_qk(q_.data(), c.n_head, k_.data(), c.n_head_kv, n, c.head_dim,
                     batch.positions.data(), rope);
    backend::write_kv(kv, il, ab, k_.data(), v_.data());
    backend::paged_attention(kv, il, ab, q_.data(), c.n_head, kq_scale, attn_.data(), pool);
    matmul(l.wo, attn_.data(), n, tmp_.data(), pool);
    backend::add_inplace(x_.data(), tmp_.data(), n * d);

    backend::rms_norm(x_.data(), l.ffn_norm, d, n, c.rms_eps, xn_.data());
    matmul_shared_input({{&l.w_gate, gate_.data()}, {&l.w_up, up_.data()}}, xn_.data(), n, pool);
    backend::silu_mul(gate_.data(), up_.data(), n * c.n_ff);
    matmul(l.w_down, gate_.data(), n, tmp_.data(), pool);
    backend::add_inplace(x_.data(), tmp_.data(), n * d);
  }

  // Only the rows whose logits are wanted go through the final norm and the output matmul.
  const int64_t m = static_cast<int64_t>(batch.logits_rows.size());
  for (int64_t i = 0; i < m; ++i)
    std::memcpy(last_.data() + i * d, x_.data() + int64_t{batch.logits_rows[i]} * d,
                d * sizeof(float));
  backend::rms_norm(last_.data(), weights_.output_norm, d, m, c.rms_eps, last_.data());
  matmul(weights_.output, last_.data(), m, logits, pool);
}

}  // namespace vesper::model
