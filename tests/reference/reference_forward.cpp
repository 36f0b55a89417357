#include "reference/reference_forward.h"

#include <cmath>
#include <initializer_list>
#include <string>

#include "backend/matmul.h"
#include "reference/reference_q8.h"
#include "reference/reference_quant.h"

namespace vesper::reference {
namespace {

// A weight matrix, dequantized exactly, and how backend::matmul treats activations against it.
struct Matrix {
  std::vector<double> w;  // row-major [n_out][n_in]
  backend::ActivationQuant quant = backend::ActivationQuant::kNone;
  // A composite weight (model.h): its parts, each over the inputs it gathers by `order`.
  std::vector<Matrix> parts;
  std::vector<int64_t> part_inputs;
  const int32_t* order = nullptr;
};

Matrix load(const model::Weight& w) {
  if (!w.parts.empty()) {
    Matrix m;
    m.order = w.input_order;
    for (const model::Weight& p : w.parts) {
      m.parts.push_back(load(p));
      m.part_inputs.push_back(p.n_in);
    }
    return m;
  }
  Matrix m;
  m.w.resize(static_cast<size_t>(w.n_in * w.n_out));
  m.quant = backend::matmul_activation_quant(w.type);
  const size_t row_bytes = tensor::row_size(w.type, w.n_in);
  for (int64_t o = 0; o < w.n_out; ++o) {
    std::vector<double> row =
        dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + o * row_bytes, w.n_in);
    std::copy(row.begin(), row.end(), m.w.begin() + o * w.n_in);
  }
  return m;
}

// One input vector as the matmuls reading it see it: for weight types whose matmul quantizes
// activations, taken as the fast path holds it (f32) and quantized as llama.cpp does
// (reference_q8.h). Each format is quantized once per input, as every matmul of that input
// quantizes it identically; so a rounding decision has one number in the trace.
class Input {
 public:
  Input(const std::vector<double>& x, RoundingTrace* trace) : x_(x), trace_(trace) {}
  const std::vector<double>& raw() const { return x_; }
  RoundingTrace* trace() const { return trace_; }
  const std::vector<double>& as_seen_by(const Matrix& m) {
    if (m.quant == backend::ActivationQuant::kNone) return x_;
    std::vector<double>& q = quantized_[static_cast<int>(m.quant)];
    if (q.empty()) {
      const std::vector<float> x_f32(x_.begin(), x_.end());
      q = quantize_activations(m.quant, x_f32.data(), static_cast<int64_t>(x_.size()), trace_);
    }
    return q;
  }

 private:
  const std::vector<double>& x_;
  RoundingTrace* trace_;
  std::vector<double> quantized_[3];
};

// The exact product of m with x as m's matmul sees it. A composite weight: each part's product
// with the activations it gathers (a new input to quantize), summed part after part.
std::vector<double> matvec(const Matrix& m, int64_t n_in, Input& in) {
  if (!m.parts.empty()) {
    std::vector<double> y;
    int64_t offset = 0;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      std::vector<double> gathered(static_cast<size_t>(m.part_inputs[i]));
      for (int64_t j = 0; j < m.part_inputs[i]; ++j) {
        const int32_t from = m.order[offset + j];
        gathered[static_cast<size_t>(j)] = from < 0 ? 0.0 : in.raw()[static_cast<size_t>(from)];
      }
      Input part_in(gathered, in.trace());
      const std::vector<double> part = matvec(m.parts[i], m.part_inputs[i], part_in);
      if (y.empty()) y.assign(part.size(), 0.0);
      for (size_t o = 0; o < part.size(); ++o) y[o] += part[o];
      offset += m.part_inputs[i];
    }
    return y;
  }
  const std::vector<double>& x = in.as_seen_by(m);
  const int64_t n_out = static_cast<int64_t>(m.w.size()) / n_in;
  std::vector<double> y(n_out, 0.0);
  for (int64_t o = 0; o < n_out; ++o)
    for (int64_t i = 0; i < n_in; ++i) y[o] += m.w[o * n_in + i] * x[i];
  return y;
}

void rms_norm(std::vector<double>& x, size_t offset, size_t n, const float* w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[offset + i] * x[offset + i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) x[offset + i] = x[offset + i] * scale * w[i];
}

// Rotates `heads` vectors of head_dim in x at position pos.
void rope(std::vector<double>& x, int64_t heads, const model::ModelConfig& c,
          const float* freq_factors, int64_t pos) {
  const int64_t dims = c.rope_dims;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < dims / 2; ++i) {
      double theta = static_cast<double>(pos) * c.rope_freq_scale *
                     std::pow(static_cast<double>(c.rope_freq_base),
                              -2.0 * static_cast<double>(i) / static_cast<double>(dims));
      if (freq_factors != nullptr) theta /= freq_factors[i];
      const bool neox = c.arch.rope_style == backend::RopeStyle::kNeox;
      const int64_t a = h * c.head_dim + (neox ? i : 2 * i);
      const int64_t b = h * c.head_dim + (neox ? i + dims / 2 : 2 * i + 1);
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      x[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
}

}  // namespace

std::vector<std::vector<double>> forward_all_positions(const model::Model& model,
                                                       const std::vector<int32_t>& tokens,
                                                       RoundingTrace* trace,
                                                       const LinearInputSink& linear_inputs) {
  auto observe = [&linear_inputs](int64_t layer, std::initializer_list<const char*> weights,
                                  const std::vector<double>& x) {
    if (!linear_inputs) return;
    const std::string prefix = layer < 0 ? "" : "blk." + std::to_string(layer) + ".";
    for (const char* weight : weights) linear_inputs(prefix + weight + ".weight", x);
  };
  const model::ModelConfig& c = model.config();
  const model::ModelWeights& w = model.weights();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t d = c.n_embd, hd = c.head_dim;

  // Hidden state of every position.
  std::vector<std::vector<double>> h(n);
  const size_t embd_row = tensor::row_size(w.token_embd.type, d);
  for (int64_t p = 0; p < n; ++p)
    h[p] = dequantize_row(w.token_embd.type,
                          static_cast<const uint8_t*>(w.token_embd.data) + tokens[p] * embd_row, d);

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const model::LayerWeights& l = w.layers[il];
    const Matrix wq = load(l.wq), wk = load(l.wk), wv = load(l.wv), wo = load(l.wo);
    const Matrix wg = load(l.w_gate), wu = load(l.w_up), wd = load(l.w_down);
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t p = 0; p < n; ++p) {
      std::vector<double> x = h[p];
      rms_norm(x, 0, d, l.attn_norm, c.rms_eps);
      observe(il, {"attn_q", "attn_k", "attn_v"}, x);
      Input in(x, trace);
      q[p] = matvec(wq, d, in);
      k[p] = matvec(wk, d, in);
      v[p] = matvec(wv, d, in);
      for (int64_t i = 0; l.bq && i < c.q_dim(); ++i) q[p][i] += l.bq[i];
      for (int64_t i = 0; l.bk && i < c.kv_dim(); ++i) k[p][i] += l.bk[i];
      for (int64_t i = 0; l.bv && i < c.kv_dim(); ++i) v[p][i] += l.bv[i];
      if (l.q_norm)
        for (int64_t hh = 0; hh < c.n_head; ++hh) rms_norm(q[p], hh * hd, hd, l.q_norm, c.rms_eps);
      if (l.k_norm)
        for (int64_t hh = 0; hh < c.n_head_kv; ++hh)
          rms_norm(k[p], hh * hd, hd, l.k_norm, c.rms_eps);
      rope(q[p], c.n_head, c, w.rope_freqs, p);
      rope(k[p], c.n_head_kv, c, w.rope_freqs, p);
    }
    const int64_t group = c.n_head / c.n_head_kv;
    for (int64_t p = 0; p < n; ++p) {
      std::vector<double> attn(c.q_dim(), 0.0);
      for (int64_t hh = 0; hh < c.n_head; ++hh) {
        const int64_t kvh = hh / group;
        std::vector<double> s(p + 1);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= p; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[p][hh * hd + i] * k[j][kvh * hd + i];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= p; ++j)
          for (int64_t i = 0; i < hd; ++i) attn[hh * hd + i] += s[j] / sum * v[j][kvh * hd + i];
      }
      observe(il, {"attn_output"}, attn);
      Input in(attn, trace);
      const std::vector<double> o = matvec(wo, c.q_dim(), in);
      for (int64_t i = 0; i < d; ++i) h[p][i] += o[i];
    }
    for (int64_t p = 0; p < n; ++p) {
      std::vector<double> x = h[p];
      rms_norm(x, 0, d, l.ffn_norm, c.rms_eps);
      observe(il, {"ffn_gate", "ffn_up"}, x);
      Input in(x, trace);
      std::vector<double> g = matvec(wg, d, in), u = matvec(wu, d, in);
      for (int64_t i = 0; i < c.n_ff; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      observe(il, {"ffn_down"}, g);
      Input in_down(g, trace);
      const std::vector<double> down = matvec(wd, c.n_ff, in_down);
      for (int64_t i = 0; i < d; ++i) h[p][i] += down[i];
    }
  }
  const Matrix out = load(w.output);
  std::vector<std::vector<double>> logits(n);
  for (int64_t p = 0; p < n; ++p) {
    std::vector<double> x = h[p];
    rms_norm(x, 0, d, w.output_norm, c.rms_eps);
    observe(-1, {"output"}, x);
    Input in(x, trace);
    logits[p] = matvec(out, d, in);
  }
  return logits;
}

}  // namespace vesper::reference
