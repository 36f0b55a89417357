#include "model/synth.h"

#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "gguf/gguf.h"
#include "hf/model_file.h"
#include "model/quantize.h"
#include "tensor/quant.h"
#include "tokenizer/hf_tokenizer.h"

namespace vesper::model {
namespace {

using tensor::GgmlType;

// A SentencePiece-style vocabulary of <unk>, <s>, </s> and the 256 byte tokens, plus filler
// pieces up to n_vocab, so that a synthetic model can tokenize any text.
void write_byte_vocab(gguf::GgufWriter& w, int64_t n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256 && static_cast<int64_t>(tokens.size()) < n_vocab; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.emplace_back(buf);
    scores.push_back(0);
    types.push_back(6);
  }
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < n_vocab; ++i) {
    tokens.push_back("\xE2\x96\x81tok" + std::to_string(i));  // "▁tokN"
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  w.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  w.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  w.set("tokenizer.ggml.unknown_token_id", gguf::Value::u32(0));
}

class TensorMaker {
 public:
  TensorMaker(gguf::GgufWriter& w, uint64_t seed, GgmlType type, ThreadPool& pool)
      : w_(w), rng_(seed), type_(type), pool_(pool) {}

  // A [n_in, n_out] matrix with uniform weights of standard deviation 1/sqrt(n_in): each
  // output then has roughly the scale of one input element.
  Status matrix(const std::string& name, int64_t n_in, int64_t n_out, float gain = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n_in * n_out));
    const float a = gain * std::sqrt(3.0f / static_cast<float>(n_in));
    std::uniform_real_distribution<float> dist(-a, a);
    for (float& x : v) x = dist(rng_);
    const GgmlType t = quantized_type_for(name, {n_in, n_out}, GgmlType::kF32, type_);
    const size_t row = tensor::row_size(t, n_in);
    std::vector<uint8_t> bytes(row * n_out);
    pool_.parallel_for(static_cast<size_t>(n_out), [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r)
        tensor::quantize_row(t, v.data() + r * n_in, bytes.data() + r * row, n_in);
    });
    return w_.add_tensor(name, {n_in, n_out}, t, bytes);
  }

  // A 1-D f32 vector around `center` with spread `spread`.
  Status vector(const std::string& name, int64_t n, float center, float spread) {
    std::vector<float> v(n);
    std::uniform_real_distribution<float> dist(center - spread, center + spread);
    for (float& x : v) x = dist(rng_);
    return w_.add_tensor(name, {n}, GgmlType::kF32,
                         {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
  }

 private:
  gguf::GgufWriter& w_;
  std::mt19937_64 rng_;
  GgmlType type_;
  ThreadPool& pool_;
};

}  // namespace

Status write_synthetic_model(const SynthSpec& s, const std::string& path, ThreadPool& pool) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3")
    return make_error("--arch \"" + s.arch + "\" is not supported; supported: llama, qwen2, qwen3");
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0)
    return make_error("model dimensions must be positive");
  if (s.n_head % s.n_head_kv != 0) return make_error("--n-head must be a multiple of --n-head-kv");
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  if (s.head_dim == 0 && s.n_embd % s.n_head != 0)
    return make_error("--n-embd must be a multiple of --n-head");
  if (head_dim % 2 != 0) return make_error("the head size must be even");
  const int64_t rope_dims = s.rope_dims > 0 ? s.rope_dims : head_dim;

  gguf::GgufWriter w;
  const std::string a = s.arch + ".";
  w.set("general.architecture", gguf::Value::string(s.arch));
  w.set("general.name", gguf::Value::string("vesper-synth"));
  w.set(a + "context_length", gguf::Value::u32(static_cast<uint32_t>(s.context_length)));
  w.set(a + "embedding_length", gguf::Value::u32(static_cast<uint32_t>(s.n_embd)));
  w.set(a + "block_count", gguf::Value::u32(static_cast<uint32_t>(s.n_layer)));
  w.set(a + "feed_forward_length", gguf::Value::u32(static_cast<uint32_t>(s.n_ff)));
  w.set(a + "attention.head_count", gguf::Value::u32(static_cast<uint32_t>(s.n_head)));
  w.set(a + "attention.head_count_kv", gguf::Value::u32(static_cast<uint32_t>(s.n_head_kv)));
  if (s.head_dim > 0) {
    w.set(a + "attention.key_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
    w.set(a + "attention.value_length", gguf::Value::u32(static_cast<uint32_t>(head_dim)));
  }
  w.set(a + "attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  w.set(a + "rope.freq_base", gguf::Value::f32(s.rope_freq_base));
  w.set(a + "rope.dimension_count", gguf::Value::u32(static_cast<uint32_t>(rope_dims)));
  if (s.rope_linear_factor > 0) {
    w.set(a + "rope.scaling.type", gguf::Value::string("linear"));
    w.set(a + "rope.scaling.factor", gguf::Value::f32(s.rope_linear_factor));
  }

  int64_t n_vocab = s.n_vocab;
  if (!s.vocab_from.empty() && std::filesystem::is_directory(s.vocab_from)) {
    // A Hugging Face tokenizer directory (a checkpoint's, or tokenizer files alone).
    VESPER_ASSIGN_OR_RETURN(auto tokenizer, tokenizer::hf_tokenizer_metadata(s.vocab_from));
    for (auto& [key, value] : tokenizer) {
      if (key == "tokenizer.ggml.tokens" && value.as_array() != nullptr)
        n_vocab = static_cast<int64_t>(value.as_array()->items.size());
      w.set(key, std::move(value));
    }
  } else if (!s.vocab_from.empty()) {
    VESPER_ASSIGN_OR_RETURN(gguf::GgufFile donor, hf::open_model_file(s.vocab_from));
    const gguf::Array* tokens = nullptr;
    VESPER_ASSIGN_OR_RETURN(tokens,
                            donor.get_array("tokenizer.ggml.tokens", gguf::ValueType::kString));
    if (tokens == nullptr)
      return make_error(s.vocab_from + ": has no tokenizer.ggml.tokens to copy");
    n_vocab = static_cast<int64_t>(tokens->items.size());
    for (const auto& [key, value] : donor.metadata())
      if (key.starts_with("tokenizer.")) w.set(key, value);
  } else {
    write_byte_vocab(w, n_vocab);
  }
  w.set("general.file_type", gguf::Value::u32(0));

  TensorMaker make(w, s.seed, s.type, pool);
  const int64_t q_dim = s.n_head * head_dim, kv_dim = s.n_head_kv * head_dim;
  // Embeddings of unit scale; matrices scaled per fan-in (see TensorMaker::matrix).
  VESPER_TRY(
      make.matrix("token_embd.weight", s.n_embd, n_vocab, std::sqrt(static_cast<float>(s.n_embd))));
  VESPER_TRY(make.vector("output_norm.weight", s.n_embd, 1.0f, 0.2f));
  if (!s.tied_embeddings) VESPER_TRY(make.matrix("output.weight", s.n_embd, n_vocab));
  if (s.rope_freq_factors) VESPER_TRY(make.vector("rope_freqs.weight", rope_dims / 2, 2.0f, 1.0f));
  for (int64_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    VESPER_TRY(make.vector(p + "attn_norm.weight", s.n_embd, 1.0f, 0.2f));
    VESPER_TRY(make.matrix(p + "attn_q.weight", s.n_embd, q_dim));
    VESPER_TRY(make.matrix(p + "attn_k.weight", s.n_embd, kv_dim));
    VESPER_TRY(make.matrix(p + "attn_v.weight", s.n_embd, kv_dim));
    VESPER_TRY(make.matrix(p + "attn_output.weight", q_dim, s.n_embd, 0.5f));
    if (s.arch == "qwen2") {
      VESPER_TRY(make.vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f));
      VESPER_TRY(make.vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f));
      VESPER_TRY(make.vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f));
    }
    if (s.arch == "qwen3") {
      VESPER_TRY(make.vector(p + "attn_q_norm.weight", head_dim, 1.0f, 0.2f));
      VESPER_TRY(make.vector(p + "attn_k_norm.weight", head_dim, 1.0f, 0.2f));
    }
    VESPER_TRY(make.vector(p + "ffn_norm.weight", s.n_embd, 1.0f, 0.2f));
    VESPER_TRY(make.matrix(p + "ffn_gate.weight", s.n_embd, s.n_ff));
    VESPER_TRY(make.matrix(p + "ffn_up.weight", s.n_embd, s.n_ff));
    VESPER_TRY(make.matrix(p + "ffn_down.weight", s.n_ff, s.n_embd, 0.5f));
  }
  return w.write(path);
}

}  // namespace vesper::model
