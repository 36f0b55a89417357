#include "reference/reference_low_rank.h"

#include "core/fp16.h"

namespace vesper::reference {

int64_t hf_source_row(int64_t g, int64_t head_dim) {
  if (head_dim == 0) return g;
  const int64_t head = g / head_dim, within = g % head_dim;
  const int64_t i = within / 2, j = within % 2;
  return head * head_dim + j * (head_dim / 2) + i;
}

namespace {
// Element i of a weight array of f32, or of IEEE fp16 with `f16`.
double weight(const void* w, bool f16, int64_t i) {
  return f16 ? double(fp16_to_f32(static_cast<const uint16_t*>(w)[i]))
             : double(static_cast<const float*>(w)[i]);
}
}  // namespace

void add_low_rank_row(const backend::LowRankDelta& d, const float* x, std::vector<double>& y) {
  std::vector<double> t(static_cast<size_t>(d.rank));
  for (int64_t j = 0; j < d.rank; ++j) {
    double s = 0;
    for (int64_t i = 0; i < d.n_in; ++i) s += weight(d.a, d.f16, j * d.a_stride + i) * double(x[i]);
    s *= d.scale;
    if (d.lambda_d) s *= d.lambda_d[j];
    t[static_cast<size_t>(j)] = s;
  }
  for (int64_t g = 0; g < d.n_out; ++g) {
    const int64_t src = hf_source_row(g, d.permute_head_dim);
    double s = 0;
    for (int64_t j = 0; j < d.rank; ++j)
      s += weight(d.b, d.f16, src * d.b_stride + j) * t[static_cast<size_t>(j)];
    if (d.lambda_b) s *= d.lambda_b[src];
    y[static_cast<size_t>(g)] += s;
  }
}

}  // namespace vesper::reference
