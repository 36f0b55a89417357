#include "reference/reference_hf_forward.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>
#include <stdexcept>

#include "gguf/safetensors.h"
#include "reference/reference_quant.h"

namespace vesper::reference {
namespace {

using TorchMatrix = std::vector<std::vector<double>>;  // [rows][cols], torch order

struct Checkpoint {
  nlohmann::json config;
  std::vector<gguf::SafetensorsFile> files;

  const gguf::SafetensorsTensor* find(const std::string& name) const {
    for (const auto& f : files)
      if (const auto* t = f.find(name)) return t;
    return nullptr;
  }
  TorchMatrix matrix(const std::string& name) const {
    const auto* t = find(name);
    if (t == nullptr) throw std::runtime_error("reference: missing tensor " + name);
    const int64_t rows = t->shape.size() == 2 ? t->shape[0] : 1;
    const int64_t cols = t->shape.back();
    const size_t row_bytes = static_cast<size_t>(cols) * tensor::traits(t->type).type_size;
    TorchMatrix m(rows);
    for (int64_t r = 0; r < rows; ++r)
      m[r] = dequantize_row(t->type, t->data + r * row_bytes, cols);
    return m;
  }
  std::vector<double> vec(const std::string& name) const { return matrix(name)[0]; }
  bool has(const std::string& name) const { return find(name) != nullptr; }
};

std::vector<double> matvec(const TorchMatrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.size(), 0.0);
  for (size_t r = 0; r < w.size(); ++r)
    for (size_t c = 0; c < x.size(); ++c) y[r] += w[r][c] * x[c];
  return y;
}

std::vector<double> rms_norm(const std::vector<double>& x, const std::vector<double>& w,
                             double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * w[i];
  return y;
}

// transformers' inv_freq, with rope_scaling applied (_compute_default / _linear / _llama3 /
// _yarn); `attention_factor` gets yarn's scale of cos and sin (1 otherwise).
std::vector<double> inverse_frequencies(const nlohmann::json& c, int64_t head_dim,
                                        double* attention_factor) {
  *attention_factor = 1.0;
  const double base = c.value("rope_theta", 10000.0);
  std::vector<double> inv(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i)
    inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (!c.contains("rope_scaling") || c["rope_scaling"].is_null()) return inv;
  const auto& s = c["rope_scaling"];
  const std::string type = s.contains("rope_type") ? s["rope_type"] : s["type"];
  const double factor = s.value("factor", 1.0);
  if (type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (type == "yarn") {
    const double fast = s.value("beta_fast", 32.0), slow = s.value("beta_slow", 1.0);
    const double original =
        s.value("original_max_position_embeddings", c["max_position_embeddings"].get<double>());
    const auto correction_dim = [&](double rotations) {
      return static_cast<double>(head_dim) *
             std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    const double low = std::max(0.0, std::floor(correction_dim(fast)));
    double high = std::min(static_cast<double>(head_dim - 1), std::ceil(correction_dim(slow)));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1 - ramp;  // the share of the original frequency
      inv[i] = inv[i] / factor * (1 - extrapolation) + inv[i] * extrapolation;
    }
    *attention_factor = 0.1 * std::log(factor) + 1.0;
  } else if (type == "llama3") {
    const double low = s.value("low_freq_factor", 1.0), high = s.value("high_freq_factor", 4.0);
    const double old_len = s.value("original_max_position_embeddings", 8192.0);
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > old_len / low) {
        f /= factor;
      } else if (wavelen >= old_len / high) {
        const double smooth = (old_len / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

// Rotate-half RoPE on each head of `x` (heads x head_dim), cos and sin scaled by `attention`.
void rope(std::vector<double>& x, int64_t heads, int64_t head_dim, int64_t pos,
          const std::vector<double>& inv, double attention) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    double* v = x.data() + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos) * inv[i];
      const double x1 = v[i], x2 = v[i + half];
      const double c = std::cos(a) * attention, s = std::sin(a) * attention;
      v[i] = x1 * c - x2 * s;
      v[i + half] = x2 * c + x1 * s;
    }
  }
}

void head_norm(std::vector<double>& x, int64_t heads, int64_t head_dim,
               const std::vector<double>& w, double eps) {
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> part(x.begin() + h * head_dim, x.begin() + (h + 1) * head_dim);
    part = rms_norm(part, w, eps);
    std::copy(part.begin(), part.end(), x.begin() + h * head_dim);
  }
}

}  // namespace

std::vector<std::vector<double>> hf_forward_all_positions(const std::string& dir,
                                                          const std::vector<int32_t>& tokens) {
  Checkpoint ck;
  std::ifstream in(dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  ck.config = nlohmann::json::parse(text.str());
  auto file = gguf::SafetensorsFile::open(dir + "/model.safetensors");
  if (!file) throw std::runtime_error(file.error().message);
  ck.files.push_back(std::move(*file));
  const nlohmann::json& c = ck.config;
  const std::string type = c.value("model_type", std::string("llama"));
  const int64_t hidden = c["hidden_size"], n_layer = c["num_hidden_layers"],
                n_head = c["num_attention_heads"];
  const int64_t n_kv = c.value("num_key_value_heads", n_head);
  const int64_t hd = c.contains("head_dim") ? c["head_dim"].get<int64_t>() : hidden / n_head;
  const double eps = c.value("rms_norm_eps", 1e-6);
  const bool tied = c.value("tie_word_embeddings", false);
  int64_t window = 0;
  if (type == "mistral" && c.contains("sliding_window") && !c["sliding_window"].is_null())
    window = c["sliding_window"];
  double attention_factor = 1.0;
  const std::vector<double> inv = inverse_frequencies(c, hd, &attention_factor);

  const TorchMatrix embed = ck.matrix("model.embed_tokens.weight");
  const int64_t n = static_cast<int64_t>(tokens.size());
  TorchMatrix x(n);
  for (int64_t p = 0; p < n; ++p) x[p] = embed[tokens[p]];
  for (int64_t l = 0; l < n_layer; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const TorchMatrix wq = ck.matrix(pre + "self_attn.q_proj.weight"),
                      wk = ck.matrix(pre + "self_attn.k_proj.weight"),
                      wv = ck.matrix(pre + "self_attn.v_proj.weight"),
                      wo = ck.matrix(pre + "self_attn.o_proj.weight");
    const std::vector<double> attn_norm = ck.vec(pre + "input_layernorm.weight");
    TorchMatrix q(n), k(n), v(n);
    for (int64_t p = 0; p < n; ++p) {
      const std::vector<double> h = rms_norm(x[p], attn_norm, eps);
      q[p] = matvec(wq, h);
      k[p] = matvec(wk, h);
      v[p] = matvec(wv, h);
      for (const char* part : {"q", "k", "v"}) {
        const std::string bias = pre + "self_attn." + part + "_proj.bias";
        if (!ck.has(bias)) continue;
        std::vector<double>& dst = part[0] == 'q' ? q[p] : part[0] == 'k' ? k[p] : v[p];
        const std::vector<double> b = ck.vec(bias);
        for (size_t i = 0; i < dst.size(); ++i) dst[i] += b[i];
      }
      if (ck.has(pre + "self_attn.q_norm.weight")) {
        head_norm(q[p], n_head, hd, ck.vec(pre + "self_attn.q_norm.weight"), eps);
        head_norm(k[p], n_kv, hd, ck.vec(pre + "self_attn.k_norm.weight"), eps);
      }
      rope(q[p], n_head, hd, p, inv, attention_factor);
      rope(k[p], n_kv, hd, p, inv, attention_factor);
    }
    for (int64_t p = 0; p < n; ++p) {
      std::vector<double> attn(n_head * hd, 0.0);
      for (int64_t h = 0; h < n_head; ++h) {
        const int64_t kvh = h / (n_head / n_kv);
        const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        std::vector<double> scores;
        double max_score = -INFINITY;
        for (int64_t t = first; t <= p; ++t) {
          double s = 0;
          for (int64_t d = 0; d < hd; ++d) s += q[p][h * hd + d] * k[t][kvh * hd + d];
          s /= std::sqrt(static_cast<double>(hd));
          scores.push_back(s);
          max_score = std::max(max_score, s);
        }
        double sum = 0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        for (int64_t t = first; t <= p; ++t)
          for (int64_t d = 0; d < hd; ++d)
            attn[h * hd + d] += scores[t - first] / sum * v[t][kvh * hd + d];
      }
      const std::vector<double> o = matvec(wo, attn);
      for (int64_t i = 0; i < hidden; ++i) x[p][i] += o[i];
    }
    const TorchMatrix gate = ck.matrix(pre + "mlp.gate_proj.weight"),
                      up = ck.matrix(pre + "mlp.up_proj.weight"),
                      down = ck.matrix(pre + "mlp.down_proj.weight");
    const std::vector<double> ffn_norm = ck.vec(pre + "post_attention_layernorm.weight");
    for (int64_t p = 0; p < n; ++p) {
      const std::vector<double> h = rms_norm(x[p], ffn_norm, eps);
      std::vector<double> g = matvec(gate, h);
      const std::vector<double> u = matvec(up, h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const std::vector<double> d = matvec(down, g);
      for (int64_t i = 0; i < hidden; ++i) x[p][i] += d[i];
    }
  }
  const std::vector<double> norm = ck.vec("model.norm.weight");
  const TorchMatrix head = tied || !ck.has("lm_head.weight") ? embed : ck.matrix("lm_head.weight");
  std::vector<std::vector<double>> logits(n);
  for (int64_t p = 0; p < n; ++p) logits[p] = matvec(head, rms_norm(x[p], norm, eps));
  return logits;
}

}  // namespace vesper::reference
