// The per-layer element-wise ops around the matmuls: rms_norm over the embedding (768 for the
// 110M model, 2048 for the 1B) and rope over 32 heads of 64, at 1 row (decode) and 64 rows
// (prefill chunk). Both are single-threaded in the backend; items_per_second = rows.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/ops.h"

namespace {

std::vector<float> random_floats(size_t n) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Args: n, rows.
void BM_RmsNorm(benchmark::State& state) {
  const int64_t n = state.range(0), rows = state.range(1);
  const std::vector<float> x = random_floats(n * rows), w = random_floats(n);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    vesper::backend::rms_norm(x.data(), w.data(), n, rows, 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * rows * 2 * 4);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
}
BENCHMARK(BM_RmsNorm)->ArgNames({"n", "rows"})->ArgsProduct({{768, 2048}, {1, 64}});

// Args: rows. 32 heads x 64 (the 1B model's queries), positions 0..rows-1, llama's style.
void BM_Rope(benchmark::State& state) {
  const int64_t rows = state.range(0), heads = 32, head_dim = 64;
  std::vector<float> x = random_floats(rows * heads * head_dim);
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r);
  vesper::backend::RopeParams params;
  params.rope_dims = head_dim;
  for (auto _ : state) {
    // In place: rotating again only changes the angles, not the work.
    vesper::backend::rope(x.data(), rows, heads, head_dim, positions.data(), params);
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
}
BENCHMARK(BM_Rope)->ArgName("rows")->Arg(1)->Arg(64);

}  // namespace
