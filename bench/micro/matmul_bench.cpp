// backend::matmul per weight type at the shapes of a 1B-class model's projections (2048 x 2048):
// GEMV (1 activation row: single-stream decode, bound by streaming the weights) and GEMM
// (64 rows: prefill and batched decode, bound by arithmetic). Counters: bytes_per_second = weight
// bytes streamed, FLOPS = 2 * n_in * n_out * rows per call, items_per_second = activation rows.
// Types whose activations are quantized to int8 (integer dots) also report peak_GMACs, the host's
// int8 multiply-add peak at the benchmark's thread count (int8_peak.h, measured right after the
// timed loop), and peak_pct, the share of it the product reaches (n_in * n_out * rows
// multiply-adds per call).
#include <benchmark/benchmark.h>

#include <chrono>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/matmul.h"
#include "backend/packed_weights.h"
#include "core/thread_pool.h"
#include "int8_peak.h"
#include "tensor/ggml_type.h"
#include "tensor/quant.h"

namespace {

using vesper::tensor::GgmlType;

constexpr GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                               GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                               GgmlType::kQ2_K, GgmlType::kQ3_K};

// Weights quantized from Gaussian values, so every block has realistic scales (random bytes
// would give NaN/inf scales and subnormal arithmetic, which time differently).
std::vector<uint8_t> random_weights(GgmlType type, int64_t n_in, int64_t n_out) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  const size_t row_bytes = vesper::tensor::row_size(type, n_in);
  std::vector<uint8_t> w(row_bytes * n_out);
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    for (auto& v : row) v = dist(rng);
    vesper::tensor::quantize_row(type, row.data(), w.data() + o * row_bytes, n_in);
  }
  return w;
}

// Uniform activations in [-1, 1).
std::vector<float> random_activations(int64_t n) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The counters every matmul benchmark reports (file comment); `seconds`: the timed loop's wall
// time (the benchmarks use real time).
void set_matmul_counters(benchmark::State& state, double seconds, GgmlType type,
                         size_t weight_bytes, int64_t n_in, int64_t n_out, int64_t rows,
                         int threads) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(weight_bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * rows);
  const double macs =
      static_cast<double>(n_in) * static_cast<double>(n_out) * static_cast<double>(rows);
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * macs, benchmark::Counter::kIsIterationInvariantRate);
  if (vesper::backend::matmul_activation_quant(type) != vesper::backend::ActivationQuant::kNone) {
    const vesper::bench::Int8Peak peak = vesper::bench::measure_int8_peak(threads);
    state.counters["peak_GMACs"] = peak.macs_per_second * 1e-9;
    state.counters["peak_pct"] =
        100.0 * macs * static_cast<double>(state.iterations()) / seconds / peak.macs_per_second;
  }
}

// Args: type index, n (n_in = n_out), activation rows, threads.
void BM_Matmul(benchmark::State& state) {
  const GgmlType type = kTypes[state.range(0)];
  const int64_t n = state.range(1), rows = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  state.SetLabel(std::string(vesper::tensor::type_name(type)));
  const std::vector<uint8_t> w = random_weights(type, n, n);
  const std::vector<float> x = random_activations(rows * n);
  std::vector<float> y(rows * n);
  vesper::ThreadPool pool(threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    vesper::backend::matmul(type, w.data(), n, n, x.data(), rows, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_matmul_counters(state, seconds_since(start), type, w.size(), n, n, rows, threads);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "n", "rows", "threads"});
  const int hw = vesper::ThreadPool::hardware_threads();
  for (int64_t t = 0; t < static_cast<int64_t>(std::size(kTypes)); ++t)
    for (int64_t rows : {1, 64})
      for (int64_t threads : {1, hw}) {
        b->Args({t, 2048, rows, threads});
        if (hw == 1) break;
      }
}

BENCHMARK(BM_Matmul)->Apply(matmul_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// The types backend::prepare_weights packs.
// New types go at the end, so that earlier results keep their indices.
constexpr GgmlType kPackedTypes[] = {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K,
                                     GgmlType::kQ6_K, GgmlType::kQ5_K, GgmlType::kQ2_K,
                                     GgmlType::kQ3_K};

// The same products over weights repacked at load (backend/packed_weights.h), as the model runs
// them: 1 row (decode), 4 and 8 (a speculative step's verification, small batches), 32 and 64
// (batched decode) and 512 (prefill, llama-bench's pp512). Args: type
// (index into kPackedTypes; the label names it), n_in, n_out, activation rows, threads.
void BM_PackedMatmul(benchmark::State& state) {
  const GgmlType type = kPackedTypes[state.range(0)];
  const int64_t n_in = state.range(1), n_out = state.range(2), rows = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  state.SetLabel(std::string(vesper::tensor::type_name(type)) + " packed");
  const std::vector<uint8_t> w = random_weights(type, n_in, n_out);
  const vesper::backend::PackedWeights packed =
      vesper::backend::prepare_weights(type, w.data(), n_in, n_out);
  const std::vector<float> x = random_activations(rows * n_in);
  std::vector<float> y(rows * n_out);
  vesper::ThreadPool pool(threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    vesper::backend::matmul(packed, x.data(), rows, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_matmul_counters(state, seconds_since(start), type, packed.bytes(), n_in, n_out, rows,
                      threads);
}

void packed_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "n_in", "n_out", "rows", "threads"});
  const int hw = vesper::ThreadPool::hardware_threads();
  for (int64_t t = 0; t < static_cast<int64_t>(std::size(kPackedTypes)); ++t)
    for (int64_t rows : {1, 4, 8, 32, 64, 512})
      for (int64_t threads : {1, hw}) {
        b->Args({t, 2048, 2048, rows, threads});
        if (hw == 1) break;
      }
}

BENCHMARK(BM_PackedMatmul)->Apply(packed_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Single-sequence decode of a 110M-class layer's attention projections (q, k, v: three packed
// q4_0 768 x 768 matrices, 1 activation row) as three matmul calls (grouped = 0) or one
// matmul_group (grouped = 1): what the model saves by not waking the pool once per matrix.
// Args: grouped, threads.
void BM_MatmulGroupQkv(benchmark::State& state) {
  const bool grouped = state.range(0) != 0;
  const int threads = static_cast<int>(state.range(1));
  constexpr int64_t kN = 768;
  state.SetLabel(grouped ? "q4_0 packed, one matmul_group" : "q4_0 packed, three matmuls");
  const std::vector<uint8_t> w = random_weights(GgmlType::kQ4_0, kN, kN);
  const vesper::backend::PackedWeights packed =
      vesper::backend::prepare_weights(GgmlType::kQ4_0, w.data(), kN, kN);
  const std::vector<float> x = random_activations(kN);
  std::vector<float> y(3 * kN);
  vesper::ThreadPool pool(threads);
  vesper::backend::MatmulTarget targets[3];
  for (int i = 0; i < 3; ++i)
    targets[i] = {&packed, GgmlType::kQ4_0, nullptr, kN, y.data() + i * kN};
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (grouped) {
      vesper::backend::matmul_group(targets, 3, kN, x.data(), 1, pool);
    } else {
      for (int i = 0; i < 3; ++i)
        vesper::backend::matmul(packed, x.data(), 1, y.data() + i * kN, pool);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  set_matmul_counters(state, seconds_since(start), GgmlType::kQ4_0, 3 * packed.bytes(), kN, 3 * kN,
                      1, threads);
}

BENCHMARK(BM_MatmulGroupQkv)
    ->ArgNames({"grouped", "threads"})
    ->ArgsProduct({{0, 1}, {vesper::ThreadPool::hardware_threads()}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The packed products as a model's decode step meets them: a 110M-class model's feed-forward
// matrices (gate, up: 768 -> 2048; down: 2048 -> 768) for `layers` layers of distinct weights,
// each called once per iteration. At 24 layers (about 64 MB of q4_0, twice this VM's L3) the
// weights stream from memory as they do in a step, where BM_PackedMatmul's one matrix stays in
// cache; at 1 layer (2.6 MB) they stay in cache: the difference is the time the kernels wait for
// memory. Args: type (index into kPackedTypes), activation rows, layers, threads.
void BM_PackedMatmulStreamed(benchmark::State& state) {
  const GgmlType type = kPackedTypes[state.range(0)];
  const int64_t rows = state.range(1), layers = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  constexpr int64_t kDim = 768, kHidden = 2048;
  state.SetLabel(std::string(vesper::tensor::type_name(type)) + " packed, " +
                 std::to_string(layers) + " layers");
  const std::vector<uint8_t> up = random_weights(type, kDim, kHidden);
  const std::vector<uint8_t> down = random_weights(type, kHidden, kDim);
  std::vector<vesper::backend::PackedWeights> w;
  for (int64_t l = 0; l < layers; ++l) {
    w.push_back(vesper::backend::prepare_weights(type, up.data(), kDim, kHidden));
    w.push_back(vesper::backend::prepare_weights(type, up.data(), kDim, kHidden));
    w.push_back(vesper::backend::prepare_weights(type, down.data(), kHidden, kDim));
  }
  size_t bytes = 0;
  for (const auto& p : w) bytes += p.bytes();
  const std::vector<float> x = random_activations(rows * kHidden);
  std::vector<float> y(rows * kHidden);
  vesper::ThreadPool pool(threads);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    for (const auto& p : w) vesper::backend::matmul(p, x.data(), rows, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  // 3 * layers matrices of kDim x kHidden multiply-adds each.
  set_matmul_counters(state, seconds_since(start), type, bytes, kDim, 3 * layers * kHidden, rows,
                      threads);
}

BENCHMARK(BM_PackedMatmulStreamed)
    ->ArgNames({"type", "rows", "layers", "threads"})
    ->ArgsProduct({{0, 3}, {1, 8, 32}, {1, 24}, {vesper::ThreadPool::hardware_threads()}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
