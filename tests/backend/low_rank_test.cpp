// The low-rank delta kernel (backend/low_rank.h, LoRA and VeRA adapters) against its f64
// reference, over odd sizes, ranks, strides (VeRA slices), lambdas and the q/k row permutation;
// and its batch invariance: a row's result is the same bits whatever rows share its run, however
// runs are split, and on any thread count.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/low_rank_kernel.h"
#include "backend/cpu/matmul_cpu.h"
#include "backend/low_rank.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "reference/reference_low_rank.h"

namespace vesper::backend {
namespace {

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// A delta with its own storage: A as a slice of [rank x a_cols], B as a slice of
// [b_rows x b_cols] (VeRA's shared matrices are wider and taller than one module's).
struct OwnedDelta {
  std::vector<float> a, b, lambda_d, lambda_b;
  std::vector<uint16_t> a16, b16;
  LowRankDelta d;
};

std::vector<uint16_t> to_fp16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_fp16(v[i]);
  return h;
}

OwnedDelta make_delta(int64_t n_in, int64_t n_out, int64_t rank, int64_t extra_cols,
                      int64_t extra_rows, bool lambdas, int64_t permute, uint64_t seed,
                      bool f16 = false) {
  OwnedDelta o;
  const int64_t a_stride = n_in + extra_cols, b_rows = n_out + extra_rows;
  o.a = random_floats(static_cast<size_t>(rank * a_stride), seed);
  o.b = random_floats(static_cast<size_t>(b_rows * rank), seed + 1);
  o.a16 = to_fp16(o.a);
  o.b16 = to_fp16(o.b);
  o.d.f16 = f16;
  o.d.a = f16 ? static_cast<const void*>(o.a16.data()) : o.a.data();
  o.d.a_stride = a_stride;
  o.d.b = f16 ? static_cast<const void*>(o.b16.data()) : o.b.data();
  o.d.b_stride = rank;
  o.d.rank = rank;
  o.d.n_in = n_in;
  o.d.n_out = n_out;
  o.d.scale = 0.75f;
  o.d.permute_head_dim = permute;
  if (lambdas) {
    o.lambda_d = random_floats(static_cast<size_t>(rank), seed + 2);
    o.lambda_b = random_floats(static_cast<size_t>(n_out), seed + 3);
    o.d.lambda_d = o.lambda_d.data();
    o.d.lambda_b = o.lambda_b.data();
  }
  return o;
}

TEST(LowRank, SourceRowIsTheHfToGgufPermutation) {
  // ADAPTERS.md: within each head of 8, gguf = hf[[0,4,1,5,2,6,3,7]].
  const int64_t want[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int64_t head = 0; head < 3; ++head)
    for (int64_t r = 0; r < 8; ++r) {
      EXPECT_EQ(low_rank_source_row(head * 8 + r, 8), head * 8 + want[r]);
      EXPECT_EQ(reference::hf_source_row(head * 8 + r, 8), head * 8 + want[r]);
    }
  EXPECT_EQ(low_rank_source_row(13, 0), 13);
}

struct Shape {
  int64_t n_in, n_out, rank, extra_cols, extra_rows;
  bool lambdas;
  int64_t permute;
  bool f16 = false;
};

class LowRankShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(LowRankShapes, MatchesTheF64Reference) {
  const Shape s = GetParam();
  const OwnedDelta first =
      make_delta(s.n_in, s.n_out, s.rank, s.extra_cols, s.extra_rows, s.lambdas, s.permute, 11);
  const OwnedDelta second =
      make_delta(s.n_in, s.n_out, std::max<int64_t>(1, s.rank / 2), 0, 0, false, 0, 23);
  const int64_t rows = 9;
  const std::vector<float> x = random_floats(static_cast<size_t>(rows * s.n_in), 5);
  std::vector<float> y = random_floats(static_cast<size_t>(rows * s.n_out), 7);
  std::vector<std::vector<double>> want(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    want[static_cast<size_t>(r)].assign(y.begin() + r * s.n_out, y.begin() + (r + 1) * s.n_out);
    // Rows 0..5 get both deltas in order, rows 6..8 the first alone.
    reference::add_low_rank_row(first.d, x.data() + r * s.n_in, want[static_cast<size_t>(r)]);
    if (r < 6)
      reference::add_low_rank_row(second.d, x.data() + r * s.n_in, want[static_cast<size_t>(r)]);
  }
  const LowRankDelta both[] = {first.d, second.d};
  const LowRankRun runs[] = {{0, 6, both}, {6, 9, std::span<const LowRankDelta>(both, 1)}};
  ThreadPool pool(2);
  add_low_rank(runs, x.data(), s.n_in, y.data(), s.n_out, pool);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < s.n_out; ++g) {
      const double exact = want[static_cast<size_t>(r)][static_cast<size_t>(g)];
      // f32 sums of n_in terms: the error grows about as the square root of their number.
      const double tol = 2e-5 * (1 + std::abs(exact)) * std::sqrt(1.0 + s.n_in / 64.0);
      EXPECT_NEAR(y[static_cast<size_t>(r * s.n_out + g)], exact, tol)
          << "row " << r << " out " << g;
    }
}

INSTANTIATE_TEST_SUITE_P(
    OddSizes, LowRankShapes,
    ::testing::Values(Shape{64, 64, 8, 0, 0, false, 8},               // stories260K attn_q, LoRA r8
                      Shape{64, 32, 4, 0, 0, false, 8},               // attn_k, rank 4
                      Shape{172, 64, 8, 0, 0, false, 0},              // ffn_down
                      Shape{64, 32, 32, 108, 140, true, 8},           // VeRA k: slices of 172 x 172
                      Shape{13, 17, 3, 2, 5, true, 0},                // odd everything
                      Shape{7, 6, 1, 0, 0, false, 2},                 // rank 1, tail-only dots
                      Shape{300, 40, 64, 0, 0, false, 0},             // rank over a row group
                      Shape{64, 64, 8, 0, 0, false, 8, true},         // fp16 storage
                      Shape{13, 17, 3, 0, 0, false, 2, true},         // fp16, odd sizes
                      Shape{2048, 512, 16, 0, 0, false, 64, true}));  // a 1B model's attn_k

TEST(LowRank, Avx2AndPortableKernelsGiveTheSameBits) {
  if (!cpu::isa_available(cpu::Isa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (const int64_t n : {1, 7, 8, 9, 16, 31, 64, 172, 2048})
    for (const bool f16 : {false, true})
      for (int rows = 1; rows <= 4; ++rows) {
        const std::vector<float> w = random_floats(static_cast<size_t>(n), 3 + n);
        const std::vector<uint16_t> w16 = to_fp16(w);
        const std::vector<float> x = random_floats(static_cast<size_t>(4 * (n + 3)), 4 + n);
        const void* wp = f16 ? static_cast<const void*>(w16.data()) : w.data();
        float a[4], b[4];
        cpu::low_rank_dot_scalar(wp, f16, x.data(), n + 3, n, rows, a);
        cpu::low_rank_dot_avx2(wp, f16, x.data(), n + 3, n, rows, b);
        for (int r = 0; r < rows; ++r)
          EXPECT_EQ(std::bit_cast<uint32_t>(a[r]), std::bit_cast<uint32_t>(b[r]))
              << "n " << n << " f16 " << f16 << " row " << r << " of " << rows;
      }
  // The expand step: every output row, permuted or not, with and without lambda_b.
  for (const int64_t rank : {1, 7, 8, 16, 33})
    for (const bool f16 : {false, true})
      for (const int64_t permute : {0, 4})
        for (int rows = 1; rows <= 4; ++rows) {
          const int64_t n_out = 12, t_stride = 40;
          const std::vector<float> b = random_floats(static_cast<size_t>(n_out * rank), 7 + rank);
          const std::vector<uint16_t> b16 = to_fp16(b);
          const std::vector<float> t = random_floats(static_cast<size_t>(4 * t_stride), 8 + rank);
          const std::vector<float> lambda = random_floats(static_cast<size_t>(n_out), 9);
          const void* bp = f16 ? static_cast<const void*>(b16.data()) : b.data();
          for (const float* lb : {static_cast<const float*>(nullptr), lambda.data()}) {
            std::vector<float> ya = random_floats(static_cast<size_t>(4 * n_out), 10), yb = ya;
            cpu::low_rank_expand_scalar(bp, f16, rank, rank, n_out, permute, lb, t.data(), t_stride,
                                        rows, ya.data(), n_out);
            cpu::low_rank_expand_avx2(bp, f16, rank, rank, n_out, permute, lb, t.data(), t_stride,
                                      rows, yb.data(), n_out);
            for (size_t i = 0; i < ya.size(); ++i)
              ASSERT_EQ(std::bit_cast<uint32_t>(ya[i]), std::bit_cast<uint32_t>(yb[i]))
                  << "rank " << rank << " f16 " << f16 << " permute " << permute << " rows " << rows
                  << " element " << i;
          }
        }
}

TEST(LowRank, BatchInvariantAcrossRunsSplitsAndThreads) {
  const int64_t n_in = 45, n_out = 38, rows = 11;
  const OwnedDelta a = make_delta(n_in, n_out, 6, 3, 2, true, 0, 101);
  const OwnedDelta b = make_delta(n_in, n_out, 5, 0, 0, false, 0, 202);
  const std::vector<float> x = random_floats(static_cast<size_t>(rows * n_in), 9);
  const std::vector<float> y0 = random_floats(static_cast<size_t>(rows * n_out), 10);
  const LowRankDelta da[] = {a.d};
  const LowRankDelta db[] = {b.d};
  // Rows 0 and 7 get b, the others a: runs of 6 and 3 rows (row groups of 4 and remainders).
  auto uses_b = [](int64_t r) { return r == 0 || r == 7; };
  // Reference layout: each row alone in its own run, one thread.
  std::vector<float> alone = y0;
  {
    ThreadPool pool(1);
    for (int64_t r = 0; r < rows; ++r) {
      const LowRankRun run[] = {{r, r + 1, uses_b(r) ? std::span<const LowRankDelta>(db) : da}};
      add_low_rank(run, x.data(), n_in, alone.data(), n_out, pool);
    }
  }
  // The same assignment as runs of several rows, on 1, 2 and 3 threads, with rows in between
  // that get nothing.
  for (int threads : {1, 2, 3}) {
    std::vector<float> y = y0;
    std::vector<LowRankRun> runs;
    for (int64_t r = 0; r < rows;) {
      int64_t end = r + 1;
      while (end < rows && uses_b(end) == uses_b(r)) ++end;
      runs.push_back({r, end, uses_b(r) ? std::span<const LowRankDelta>(db) : da});
      r = end;
    }
    ThreadPool pool(threads);
    add_low_rank(runs, x.data(), n_in, y.data(), n_out, pool);
    EXPECT_EQ(y, alone) << threads << " threads";
  }
}

}  // namespace
}  // namespace vesper::backend
