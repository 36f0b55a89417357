// Low-rank deltas added to a matmul's output (LoRA and VeRA adapters, src/lora/): for the rows
// of a run, y[r] += delta(x[r]) for each of the run's deltas, in order. One forward pass serves
// rows of many adapters this way: the base matmul runs once over every row, then each run of
// rows that share an adapter gets its adapter's shrink (A x) and expand (B t) products, as
// S-LoRA / Punica's SGMV do.
//
// A delta is  y[g] += lb[src(g)] * sum_j B[src(g)][j] * (ld[j] * (scale * sum_i A[j][i] x[i]))
// with lb, ld = 1 when absent and src(g) = g unless `permute_head_dim` is set: then output row g
// takes source row src(g) = the Hugging Face row of GGUF row g within its head of
// permute_head_dim rows (GGUF's rope order interleaves the two halves of each head:
// gguf(h, 2i + j) = hf(h, j * hd/2 + i)). That is how a VeRA adapter, whose B is shared by every
// module and so cannot be stored permuted, applies to q and k of a GGUF model.
//
// Numeric contract (the same bits on every ISA, whatever rows or threads a batch has): each dot
// product of n terms is eight f32 lanes d[l] = sum over chunks c in order of a[8c+l] * x[8c+l]
// (a product, then an add; never fused), from +0, combined as ((d0+d1)+(d2+d3))+((d4+d5)+(d6+d7)),
// then the n % 8 tail added in order. t_j = dot(A_j, x) * scale (* ld[j]);
// y[g] += dot(B_src, t) (* lb[src]). A row's result depends on its own x and its deltas only.
// fp16 weights are widened to f32 exactly before the products, so they change nothing above; the
// AVX2 kernel (F16C, a multiply then an add per lane) computes the portable one's bits.
#pragma once

#include <cstdint>
#include <span>

#include "core/thread_pool.h"

namespace vesper::backend {

// The largest rank a delta may have (vLLM's --max-lora-rank tops out at 512 too).
inline constexpr int64_t kMaxLowRank = 512;

// One module's delta for the CPU kernel: host pointers (Backend::add_low_rank's LowRankModule,
// with its buffers resolved).
struct LowRankDelta {
  const void* a = nullptr;  // rank rows of n_in, a_stride apart (f32, or fp16 with f16)
  int64_t a_stride = 0;
  const void* b = nullptr;  // n_out rows (source order) of rank, b_stride apart
  int64_t b_stride = 0;
  bool f16 = false;  // a and b hold IEEE fp16 (widened exactly: the contract is unchanged)
  int64_t rank = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  float scale = 1.0f;
  const float* lambda_d = nullptr;  // [rank] or none
  const float* lambda_b = nullptr;  // [n_out], source order, or none
  int64_t permute_head_dim = 0;     // 0: no permutation
};

// Rows [row_begin, row_end) of the batch get `deltas`, in order.
struct LowRankRun {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  std::span<const LowRankDelta> deltas;
};

// The source row of output row g for a delta whose permute_head_dim is `head_dim` (see above).
inline int64_t low_rank_source_row(int64_t g, int64_t head_dim) {
  if (head_dim == 0) return g;
  const int64_t head = g / head_dim, r = g % head_dim;
  return head * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

// The CPU kernel: y (rows of y_cols) += each run's deltas of x (rows of x_cols), runs split
// over the pool's threads by groups of rows. Every delta of a run must have n_in == x_cols and
// n_out == y_cols.
void add_low_rank(std::span<const LowRankRun> runs, const float* x, int64_t x_cols, float* y,
                  int64_t y_cols, ThreadPool& pool);

}  // namespace vesper::backend
