// The f64 reference of a low-rank delta (backend/low_rank.h): y[g] += lambda_b[src(g)] *
// sum_j B[src(g)][j] * lambda_d[j] * scale * sum_i A[j][i] x[i], every product and sum in
// double, with the Hugging Face -> GGUF row permutation spelled out here independently.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/low_rank.h"

namespace vesper::reference {

// The source row of GGUF row g for heads of `head_dim` rows (0: no permutation): within a head,
// GGUF row 2i + j is Hugging Face row j * head_dim / 2 + i.
int64_t hf_source_row(int64_t g, int64_t head_dim);

// y (one row of d.n_out, f64) += the delta of x (one row of d.n_in).
void add_low_rank_row(const backend::LowRankDelta& d, const float* x, std::vector<double>& y);

}  // namespace vesper::reference
