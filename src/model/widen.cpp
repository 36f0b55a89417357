#include "model/widen.h"

#include <cmath>
#include <vector>

#include "gguf/gguf.h"
#include "model/model_config.h"
#include "model/quantize.h"
#include "tensor/quant.h"

namespace vesper::model {
namespace {

using tensor::GgmlType;

// The f32 values of a tensor (rows of shape[0]).
std::vector<float> dequantized(const gguf::TensorInfo& t) {
  const int64_t n = t.shape[0], rows = t.rows();
  std::vector<float> v(static_cast<size_t>(n * rows));
  const size_t row_bytes = tensor::row_size(t.type, n);
  for (int64_t r = 0; r < rows; ++r)
    tensor::dequantize_row(t.type, t.data + r * row_bytes, v.data() + r * n, n);
  return v;
}

}  // namespace

Status widen_model(const std::string& from, const WidenSpec& s, const std::string& out,
                   ThreadPool& pool) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::open(from));
  VESPER_ASSIGN_OR_RETURN(ModelConfig c, read_model_config(file));
  if (c.arch.name != "llama")
    return make_error(from + ": only llama models can be widened, not " + c.arch.name);
  auto too_small = [&](const char* flag, int64_t want, int64_t have) {
    return make_error(std::string(flag) + " " + std::to_string(want) + " is smaller than " + from +
                      "'s " + std::to_string(have));
  };
  if (s.n_embd < c.n_embd) return too_small("--n-embd", s.n_embd, c.n_embd);
  if (s.n_head < c.n_head) return too_small("--n-head", s.n_head, c.n_head);
  if (s.n_head_kv < c.n_head_kv) return too_small("--n-head-kv", s.n_head_kv, c.n_head_kv);
  if (s.n_ff < c.n_ff) return too_small("--n-ff", s.n_ff, c.n_ff);
  if (s.n_head * c.n_head_kv != s.n_head_kv * c.n_head)
    return make_error("--n-head " + std::to_string(s.n_head) + " / --n-head-kv " +
                      std::to_string(s.n_head_kv) + " must keep " + from + "'s ratio of " +
                      std::to_string(c.n_head / c.n_head_kv) + " query heads per KV head");
  // The head size stays: head_dim of the original = n_embd / n_head there; here it is written out.
  const int64_t head_dim = c.head_dim;
  const int64_t q_dim = s.n_head * head_dim, kv_dim = s.n_head_kv * head_dim;
  const double ratio = static_cast<double>(c.n_embd) / static_cast<double>(s.n_embd);

  gguf::GgufWriter w;
  w.copy_metadata(file);
  const std::string a = "llama.";
  w.set(a + "embedding_length", gguf::Value::u32(static_cast<uint32_t>(s.n_embd)));
  w.set(a + "feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(s.n_ff)));
  w.set(a + "attention.head_count", gguf::Value::u32(static_cast<uint32_t>(s.n_head)));
  w.set(a + "attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(s.n_head_kv)));
  w.set(a + "attention.key_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  w.set(a + "attention.value_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  w.set(a + "rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(c.rope_dims)));
  w.set(a + "attention.layer_norm_rms_epsilon",
        gguf::Value::f32(static_cast<float>(c.rms_eps * ratio)));
  w.set("general.name", gguf::Value::string("widened " + file.path()));

  for (const gguf::TensorInfo& t : file.tensors()) {
    const std::vector<float> v = dequantized(t);
    if (t.shape.size() == 1) {
      // Norm weights: the real ones scaled, the new dimensions zero.
      const bool hidden = t.shape[0] == c.n_embd && t.name.find("norm") != std::string::npos;
      if (!hidden)
        return make_error(from + ": tensor " + t.name +
                          ": a vector this tool does not know how to widen");
      std::vector<float> nv(static_cast<size_t>(s.n_embd), 0.0f);
      for (int64_t i = 0; i < c.n_embd; ++i) nv[i] = static_cast<float>(v[i] * std::sqrt(ratio));
      VESPER_TRY(
          w.add_tensor(t.name, {s.n_embd}, GgmlType::kF32,
                       {reinterpret_cast<const uint8_t*>(nv.data()), nv.size() * sizeof(float)}));
      continue;
    }
    // A matrix [n_in, n_out]: each side widened as what it is (hidden, heads, feed-forward, vocab).
    const std::string& n = t.name;
    auto has = [&](const char* part) { return n.find(part) != std::string::npos; };
    int64_t new_in = 0, new_out = 0;
    if (has("token_embd") || n == "output.weight") {
      new_in = s.n_embd, new_out = t.shape[1];
    } else if (has("attn_output")) {
      new_in = q_dim, new_out = s.n_embd;
    } else if (has("attn_q")) {
      new_in = s.n_embd, new_out = q_dim;
    } else if (has("attn_k") || has("attn_v")) {
      new_in = s.n_embd, new_out = kv_dim;
    } else if (has("ffn_down")) {
      new_in = s.n_ff, new_out = s.n_embd;
    } else if (has("ffn_gate") || has("ffn_up")) {
      new_in = s.n_embd, new_out = s.n_ff;
    } else {
      return make_error(from + ": tensor " + n + ": a matrix this tool does not know how to widen");
    }
    const int64_t n_in = t.shape[0], n_out = t.shape[1];
    std::vector<float> nv(static_cast<size_t>(new_in * new_out), 0.0f);
    for (int64_t r = 0; r < n_out; ++r)
      std::copy(v.begin() + r * n_in, v.begin() + (r + 1) * n_in, nv.begin() + r * new_in);
    const GgmlType type = quantized_type_for(t.name, {new_in, new_out}, GgmlType::kF32, s.type);
    const size_t row = tensor::row_size(type, new_in);
    std::vector<uint8_t> bytes(row * static_cast<size_t>(new_out));
    pool.parallel_for(static_cast<size_t>(new_out), [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r)
        tensor::quantize_row(type, nv.data() + r * new_in, bytes.data() + r * row, new_in);
    });
    VESPER_TRY(w.add_tensor(t.name, {new_in, new_out}, type, bytes));
  }
  return w.write(out);
}

}  // namespace vesper::model
