#include "backend/low_rank.h"

#include <algorithm>
#include <array>

#include "core/check.h"

namespace vesper::backend {
namespace {

// Rows a task takes together: each A and B row is loaded once for all of them. The arithmetic
// of a row is the same whichever group it is in (the numeric contract of low_rank.h).
constexpr int64_t kRowGroup = 4;

// Dot products of one weight row w[n] with `nr` activation rows x[r] (x_stride apart), each by
// the contract's eight lanes, tree and ordered tail.
template <int kRows>
void dot_rows(const float* w, const float* x, int64_t x_stride, int64_t n, float* out) {
  float lanes[kRows][8] = {};
  const int64_t body = n - n % 8;
  for (int64_t i = 0; i < body; i += 8)
    for (int r = 0; r < kRows; ++r)
      for (int l = 0; l < 8; ++l) {
        const float p = w[i + l] * x[r * x_stride + i + l];
        lanes[r][l] = lanes[r][l] + p;
      }
  for (int r = 0; r < kRows; ++r) {
    const float* d = lanes[r];
    float sum = ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
    for (int64_t i = body; i < n; ++i) sum = sum + w[i] * x[r * x_stride + i];
    out[r] = sum;
  }
}

template <int kRows>
void apply_delta(const LowRankDelta& d, const float* x, int64_t x_cols, float* y, int64_t y_cols) {
  // t[r][j]: row r's shrink product, scaled.
  std::array<std::array<float, kMaxLowRank>, kRows> t;
  float out[kRows];
  for (int64_t j = 0; j < d.rank; ++j) {
    dot_rows<kRows>(d.a + j * d.a_stride, x, x_cols, d.n_in, out);
    for (int r = 0; r < kRows; ++r) {
      float v = out[r] * d.scale;
      if (d.lambda_d != nullptr) v = v * d.lambda_d[j];
      t[r][j] = v;
    }
  }
  for (int64_t g = 0; g < d.n_out; ++g) {
    const int64_t src = low_rank_source_row(d, g);
    dot_rows<kRows>(d.b + src * d.b_stride, t[0].data(), kMaxLowRank, d.rank, out);
    for (int r = 0; r < kRows; ++r) {
      float v = out[r];
      if (d.lambda_b != nullptr) v = v * d.lambda_b[src];
      y[r * y_cols + g] = y[r * y_cols + g] + v;
    }
  }
}

}  // namespace

void add_low_rank(std::span<const LowRankRun> runs, const float* x, int64_t x_cols, float* y,
                  int64_t y_cols, ThreadPool& pool) {
  // Tasks: groups of up to kRowGroup rows of one run.
  struct Task {
    int64_t run, row, rows;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].deltas.empty()) continue;
    for (int64_t r = runs[i].row_begin; r < runs[i].row_end; r += kRowGroup)
      tasks.push_back(Task{static_cast<int64_t>(i), r, std::min(kRowGroup, runs[i].row_end - r)});
  }
  if (tasks.empty()) return;
  pool.parallel_for(tasks.size(), [&](size_t begin, size_t end) {
    for (size_t k = begin; k < end; ++k) {
      const Task& task = tasks[k];
      const float* xr = x + task.row * x_cols;
      float* yr = y + task.row * y_cols;
      for (const LowRankDelta& d : runs[static_cast<size_t>(task.run)].deltas) {
        VESPER_CHECK(d.rank > 0 && d.rank <= kMaxLowRank && d.n_in == x_cols && d.n_out == y_cols,
                     "add_low_rank: delta shape does not match");
        switch (task.rows) {
          case 4:
            apply_delta<4>(d, xr, x_cols, yr, y_cols);
            break;
          case 3:
            apply_delta<3>(d, xr, x_cols, yr, y_cols);
            break;
          case 2:
            apply_delta<2>(d, xr, x_cols, yr, y_cols);
            break;
          default:
            apply_delta<1>(d, xr, x_cols, yr, y_cols);
        }
      }
    }
  });
}

}  // namespace vesper::backend
