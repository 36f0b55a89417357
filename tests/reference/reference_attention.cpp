#include "reference/reference_attention.h"

#include <algorithm>
#include <cmath>

namespace vesper::reference {

std::vector<double> attention(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              const std::vector<const float*>& keys,
                              const std::vector<const float*>& values, double scale) {
  const int64_t group = n_heads / n_kv_heads;
  const size_t n = keys.size();
  std::vector<double> out(static_cast<size_t>(n_heads * head_dim), 0.0);
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t kvh = h / group;
    std::vector<double> s(n);
    double mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < head_dim; ++d)
        dot += static_cast<double>(q[h * head_dim + d]) * keys[j][kvh * head_dim + d];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (size_t j = 0; j < n; ++j)
      for (int64_t d = 0; d < head_dim; ++d)
        out[h * head_dim + d] += s[j] / sum * values[j][kvh * head_dim + d];
  }
  return out;
}

std::vector<std::vector<double>> batch_attention(const model::ForwardBatch& batch, int64_t block_size,
                                                 const std::function<const float*(int64_t)>& key,
                                                 const std::function<const float*(int64_t)>& value,
                                                 const float* q, int64_t n_heads, int64_t n_kv_heads,
                                                 int64_t head_dim, double scale) {
  std::vector<std::vector<double>> out;
  for (int64_t r = 0; r < batch.num_tokens(); ++r) {
    const int32_t s = batch.token_seq[r];
    const int32_t first = batch.query_start[s];
    const int32_t* table = batch.block_tables.data() + batch.table_offsets[s];
    auto slot_of = [&](int64_t pos) { return int64_t{table[pos / block_size]} * block_size + pos % block_size; };
    std::vector<const float*> keys, values;
    const bool tree = batch.has_trees() && batch.tree_parents[r] != model::kNoTree;
    // The context: every position before the sequence's first row (tree), or before this row.
    const int64_t context = tree ? batch.positions[first] : batch.positions[r];
    for (int64_t p = 0; p < context; ++p) {
      keys.push_back(key(slot_of(p)));
      values.push_back(value(slot_of(p)));
    }
    if (tree) {
      // The path from the root to this row, root first.
      std::vector<int64_t> path;
      for (int64_t node = r - first; node >= 0; node = batch.tree_parents[first + node]) path.push_back(first + node);
      for (auto it = path.rbegin(); it != path.rend(); ++it) {
        keys.push_back(key(batch.slot_mapping[*it]));
        values.push_back(value(batch.slot_mapping[*it]));
      }
    } else {
      keys.push_back(key(slot_of(batch.positions[r])));
      values.push_back(value(slot_of(batch.positions[r])));
    }
    out.push_back(attention(q + r * n_heads * head_dim, n_heads, n_kv_heads, head_dim, keys, values, scale));
  }
  return out;
}

std::vector<double> rms_norm(const float* x, const float* weight, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  std::vector<double> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
  return y;
}

double silu_mul(double gate, double up) {
  return gate / (1.0 + std::exp(-gate)) * up;
}

std::vector<double> rope(const float* x, int64_t heads, int64_t head_dim, int32_t position,
                         const backend::RopeParams& params) {
  const int64_t dims = params.rope_dims;
  std::vector<double> y(x, x + heads * head_dim);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < dims / 2; ++i) {
      double theta = static_cast<double>(position) * params.freq_scale *
                     std::pow(static_cast<double>(params.freq_base),
                              -2.0 * static_cast<double>(i) / static_cast<double>(dims));
      if (params.freq_factors != nullptr) theta /= params.freq_factors[i];
      const bool neox = params.style == backend::RopeStyle::kNeox;
      const int64_t a = h * head_dim + (neox ? i : 2 * i);
      const int64_t b = h * head_dim + (neox ? i + dims / 2 : 2 * i + 1);
      const double x0 = x[a], x1 = x[b];
      y[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      y[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
  return y;
}

}  // namespace vesper::reference
