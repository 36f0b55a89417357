#include "backend/low_rank.h"

#include <algorithm>
#include <array>

#include "backend/cpu/low_rank_kernel.h"
#include "backend/cpu/matmul_cpu.h"
#include "core/check.h"
#include "core/fp16.h"

namespace vesper::backend {
namespace cpu {

void low_rank_dot_scalar(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                         int rows, float* out) {
  const auto* wf = static_cast<const float*>(w);
  const auto* wh = static_cast<const uint16_t*>(w);
  auto weight = [&](int64_t i) { return f16 ? fp16_to_f32(wh[i]) : wf[i]; };
  float lanes[4][8] = {};
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8) {
    float wv[8];
    for (int l = 0; l < 8; ++l) wv[l] = weight(i + l);
    for (int r = 0; r < rows; ++r)
      for (int l = 0; l < 8; ++l) {
        const float p = wv[l] * x[r * x_stride + i + l];
        lanes[r][l] = lanes[r][l] + p;
      }
  }
  for (int r = 0; r < rows; ++r) {
    float sum = low_rank_fold(lanes[r]);
    for (int64_t i = body; i < n; ++i) sum = sum + weight(i) * x[r * x_stride + i];
    out[r] = sum;
  }
}

void low_rank_expand_scalar(const void* b, bool f16, int64_t b_stride, int64_t rank, int64_t n_out,
                            int64_t permute_head_dim, const float* lambda_b, const float* t,
                            int64_t t_stride, int rows, float* y, int64_t y_stride) {
  const size_t elem = f16 ? 2 : 4;
  float out[4];
  for (int64_t g = 0; g < n_out; ++g) {
    const int64_t src = low_rank_source_row(g, permute_head_dim);
    low_rank_dot_scalar(
        static_cast<const std::byte*>(b) + static_cast<size_t>(src * b_stride) * elem, f16, t,
        t_stride, rank, rows, out);
    for (int r = 0; r < rows; ++r) {
      float v = out[r];
      if (lambda_b != nullptr) v = v * lambda_b[src];
      y[r * y_stride + g] = y[r * y_stride + g] + v;
    }
  }
}

}  // namespace cpu

namespace {

// Rows a task takes together: each A and B row is loaded once for all of them. The arithmetic
// of a row is the same whichever group it is in (the numeric contract of low_rank.h).
constexpr int kRowGroup = 4;

struct Kernels {
  cpu::LowRankDotFn dot;
  cpu::LowRankExpandFn expand;
};

Kernels select_kernels() {
  if (cpu::selected_isa() != cpu::Isa::kScalar)
    return {cpu::low_rank_dot_avx2, cpu::low_rank_expand_avx2};
  return {cpu::low_rank_dot_scalar, cpu::low_rank_expand_scalar};
}

// Applies one delta to `rows` consecutive rows.
void apply_delta(const LowRankDelta& d, const float* x, int64_t x_cols, float* y, int64_t y_cols,
                 int rows, const Kernels& k) {
  const size_t elem = d.f16 ? 2 : 4;
  const auto* a = static_cast<const std::byte*>(d.a);
  // t[r * kMaxLowRank + j]: row r's shrink product, scaled.
  std::array<float, kRowGroup * kMaxLowRank> t;
  float out[kRowGroup];
  for (int64_t j = 0; j < d.rank; ++j) {
    k.dot(a + static_cast<size_t>(j * d.a_stride) * elem, d.f16, x, x_cols, d.n_in, rows, out);
    for (int r = 0; r < rows; ++r) {
      float v = out[r] * d.scale;
      if (d.lambda_d != nullptr) v = v * d.lambda_d[j];
      t[static_cast<size_t>(r * kMaxLowRank + j)] = v;
    }
  }
  k.expand(d.b, d.f16, d.b_stride, d.rank, d.n_out, d.permute_head_dim, d.lambda_b, t.data(),
           kMaxLowRank, rows, y, y_cols);
}

}  // namespace

void add_low_rank(std::span<const LowRankRun> runs, const float* x, int64_t x_cols, float* y,
                  int64_t y_cols, ThreadPool& pool) {
  static const Kernels kernels = select_kernels();
  // Tasks: groups of up to kRowGroup rows of one run (reused: this runs per projection and step).
  struct Task {
    int64_t run, row;
    int rows;
  };
  thread_local std::vector<Task> reused;
  std::vector<Task>& tasks = reused;  // a reference: the pool's threads must read this thread's
  tasks.clear();
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].deltas.empty()) continue;
    for (const LowRankDelta& d : runs[i].deltas)
      VESPER_CHECK(d.rank > 0 && d.rank <= kMaxLowRank && d.n_in == x_cols && d.n_out == y_cols,
                   "add_low_rank: delta shape does not match");
    for (int64_t r = runs[i].row_begin; r < runs[i].row_end; r += kRowGroup)
      tasks.push_back(Task{static_cast<int64_t>(i), r,
                           static_cast<int>(std::min<int64_t>(kRowGroup, runs[i].row_end - r))});
  }
  if (tasks.empty()) return;
  pool.parallel_for(tasks.size(), [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const Task& task = tasks[k];
      for (const LowRankDelta& d : runs[static_cast<size_t>(task.run)].deltas)
        apply_delta(d, x + task.row * x_cols, x_cols, y + task.row * y_cols, y_cols, task.rows,
                    kernels);
    }
  });
}

}  // namespace vesper::backend
