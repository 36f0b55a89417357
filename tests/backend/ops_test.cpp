// The element-wise ops against f64 references (tests/reference/reference_attention.h): the shared
// exp's accuracy, RMSNorm, SwiGLU and RoPE; the AVX2 and portable kernels bit for bit; and
// rope_qk equal to rope on queries and keys separately.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "backend/cpu/ops_kernel.h"
#include "backend/cpu/vec_exp.h"
#include "backend/cpu_backend.h"
#include "backend/ops.h"
#include "reference/reference_attention.h"

namespace vesper::backend {
namespace {

bool have_avx2() {
  return cpu::isa_available(cpu::Isa::kAvx2);
}

std::vector<float> random_floats(size_t n, float range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Distance in units in the last place of the f32 nearest to the exact value.
double ulps(float got, double exact) {
  const float near = static_cast<float>(exact);
  const double ulp = std::nextafter(near, INFINITY) - near;
  return std::abs(static_cast<double>(got) - exact) / ulp;
}

TEST(VecExp, WithinTwoUlpOverTheNormalRange) {
  double worst = 0;
  float worst_x = 0;
  // Every 97th float from ln(2^-126) to the clamp, plus integers and half-integers.
  for (float x = cpu::kExpMin; x < cpu::kExpMax;) {
    const double u = ulps(cpu::exp_lane(x), std::exp(static_cast<double>(x)));
    if (u > worst) worst = u, worst_x = x;
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    bits = x < 0 ? (bits > 97 + 0x80000000u ? bits - 97 : 0) : bits + 97;
    std::memcpy(&x, &bits, sizeof(bits));
  }
  std::printf("  exp: worst %.3f ulp at x = %.9g\n", worst, worst_x);
  EXPECT_LE(worst, 2.0) << "at x = " << worst_x;
  EXPECT_EQ(cpu::exp_lane(0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_lane(-0.0f), 1.0f);
  EXPECT_EQ(cpu::exp_lane(-INFINITY), 0.0f);
  EXPECT_EQ(cpu::exp_lane(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_lane(1000.0f), cpu::exp_lane(cpu::kExpMax));
  EXPECT_TRUE(std::isfinite(cpu::exp_lane(cpu::kExpMax)));
}

TEST(RmsNorm, MatchesF64ReferenceAndIsaBitIdentical) {
  for (int64_t n : {1, 7, 8, 9, 33, 64, 768, 1001}) {
    const int64_t rows = 3;
    const auto x = random_floats(n * rows, 4.0f, n);
    const auto w = random_floats(n, 2.0f, n + 1);
    std::vector<float> y(n * rows), ys(n * rows);
    rms_norm(x.data(), w.data(), n, rows, 1e-5f, y.data());
    cpu::rms_norm_scalar(x.data(), w.data(), n, rows, 1e-5f, ys.data());
    ASSERT_EQ(0, std::memcmp(y.data(), ys.data(), y.size() * sizeof(float))) << "n " << n;
    if (have_avx2()) {
      std::vector<float> ya(n * rows);
      cpu::rms_norm_avx2(x.data(), w.data(), n, rows, 1e-5f, ya.data());
      ASSERT_EQ(0, std::memcmp(ya.data(), ys.data(), y.size() * sizeof(float))) << "n " << n;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const auto ref = reference::rms_norm(x.data() + r * n, w.data(), n, 1e-5);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(y[r * n + i], ref[i], 4e-7 * std::abs(ref[i]) + 1e-30)
            << "n " << n << " i " << i;
    }
    // In place (x and y alias) gives the same bits.
    std::vector<float> inplace = x;
    rms_norm(inplace.data(), w.data(), n, rows, 1e-5f, inplace.data());
    ASSERT_EQ(0, std::memcmp(inplace.data(), y.data(), y.size() * sizeof(float)));
  }
}

TEST(SiluMul, MatchesF64ReferenceAndIsaBitIdentical) {
  for (int64_t n : {1, 7, 8, 13, 2048}) {
    auto gate = random_floats(n, 20.0f, 3 * n);
    gate[0] = -95.0f;  // exp(-g) clamps: silu -> -0
    if (n > 1) gate[1] = 95.0f;
    const auto up = random_floats(n, 3.0f, 3 * n + 1);
    std::vector<float> g = gate, gs = gate;
    silu_mul(g.data(), up.data(), n);
    cpu::silu_mul_scalar(gs.data(), up.data(), n);
    ASSERT_EQ(0, std::memcmp(g.data(), gs.data(), n * sizeof(float))) << "n " << n;
    if (have_avx2()) {
      std::vector<float> ga = gate;
      cpu::silu_mul_avx2(ga.data(), up.data(), n);
      ASSERT_EQ(0, std::memcmp(ga.data(), gs.data(), n * sizeof(float))) << "n " << n;
    }
    for (int64_t i = 0; i < n; ++i) {
      const double ref = reference::silu_mul(gate[i], up[i]);
      ASSERT_NEAR(g[i], ref, 1e-6 * std::abs(ref) + 1e-35) << "n " << n << " gate " << gate[i];
    }
  }
}

TEST(Rope, MatchesF64ReferenceAndRopeQkEqualsSeparateCalls) {
  const int64_t head_dim = 14, n_head = 5, n_head_kv = 1, rows = 4;
  const int32_t positions[rows] = {0, 1, 37, 511};
  const float factors[7] = {1.0f, 1.5f, 2.0f, 4.0f, 8.0f, 8.0f, 16.0f};
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox})
    for (int64_t dims : {int64_t{14}, int64_t{6}})
      for (bool with_factors : {false, true}) {
        RopeParams p;
        p.style = style;
        p.rope_dims = dims;
        p.freq_base = 10000.0f;
        p.freq_scale = with_factors ? 0.25f : 1.0f;
        p.freq_factors = with_factors ? factors : nullptr;
        const auto q0 = random_floats(rows * n_head * head_dim, 1.0f, dims);
        const auto k0 = random_floats(rows * n_head_kv * head_dim, 1.0f, dims + 1);
        std::vector<float> q = q0, k = k0, q2 = q0, k2 = k0;
        rope(q.data(), rows, n_head, head_dim, positions, p);
        rope(k.data(), rows, n_head_kv, head_dim, positions, p);
        rope_qk(q2.data(), n_head, k2.data(), n_head_kv, rows, head_dim, positions, p);
        ASSERT_EQ(0, std::memcmp(q.data(), q2.data(), q.size() * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(k.data(), k2.data(), k.size() * sizeof(float)));
        for (int64_t r = 0; r < rows; ++r) {
          const auto ref =
              reference::rope(q0.data() + r * n_head * head_dim, n_head, head_dim, positions[r], p);
          // Angles are built in f32 by repeated multiplication (as ggml does), so at position
          // 511 they carry a few f32 ulps of the angle, about 511 * 2^-24 * a few.
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_NEAR(q[r * n_head * head_dim + i], ref[i], 2e-4)
                << "row " << r << " element " << i << " dims " << dims;
        }
      }
}

// CpuBackend splits a prompt's rows of the row-wise and element-wise ops over its threads; every
// thread count gives one thread's bits. 300 rows of 771 (a tail past the vectors' 8 lanes in each
// row, and splits that fall mid-vector of the flat element-wise ops) and RoPE on 12 + 4 heads.
TEST(CpuBackendOps, RowsSplitAcrossThreadsGiveOneThreadsBits) {
  const int64_t rows = 300, n = 771, head_dim = 64, n_head = 12, n_head_kv = 4;
  const auto x0 = random_floats(rows * n, 2.0f, 1), y0 = random_floats(rows * n, 2.0f, 2);
  const auto w0 = random_floats(n, 1.0f, 3);
  const auto q0 = random_floats(rows * n_head * head_dim, 1.0f, 4);
  const auto k0 = random_floats(rows * n_head_kv * head_dim, 1.0f, 5);
  std::vector<int32_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>(r * 7 % 1000);
  // Per thread count: rms_norm(x), x + y, silu(x) * y, rms_norm_heads(q), rope(q, k).
  auto run = [&](int threads) {
    CpuBackend b(threads);
    auto put = [&](const std::vector<float>& v, int64_t r, int64_t c) {
      Tensor t = b.allocate(DType::kF32, r, c, MemoryKind::kDevice);
      b.copy_to_device(t, v.data());
      return t;
    };
    auto get = [&](const Tensor& t) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      b.copy_to_host(v.data(), t);
      return v;
    };
    const Tensor w = put(w0, 1, n),
                 hw = put(std::vector<float>(w0.begin(), w0.begin() + head_dim), 1, head_dim);
    const Tensor normed = b.allocate(DType::kF32, rows, n, MemoryKind::kDevice);
    b.rms_norm(put(x0, rows, n), w, 1e-5f, normed);
    const Tensor sum = put(x0, rows, n);
    b.add(sum, put(y0, rows, n));
    const Tensor gate = put(x0, rows, n);
    b.silu_mul(gate, put(y0, rows, n));
    const Tensor q = put(q0, rows, n_head * head_dim), k = put(k0, rows, n_head_kv * head_dim);
    b.rms_norm_heads(q, hw, head_dim, 1e-6f);
    RopeConfig rope;
    rope.rope_dims = head_dim;
    const Tensor pos = b.allocate(DType::kI32, rows, 1, MemoryKind::kDevice);
    b.copy_to_device(pos, positions.data());
    b.rope_qk(q, k, head_dim, pos, rope);
    b.synchronize();
    return std::vector<std::vector<float>>{get(normed), get(sum), get(gate), get(q), get(k)};
  };
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (size_t i = 0; i < one.size(); ++i)
      ASSERT_EQ(0, std::memcmp(one[i].data(), many[i].data(), one[i].size() * sizeof(float)))
          << "output " << i << " with " << threads << " threads";
  }
}

}  // namespace
}  // namespace vesper::backend
