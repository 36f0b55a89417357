// Tests of backend/packed_weights.h: matmul over 8-row packed q4_0 / q8_0 and k-quant (q2_K ...
// q6_K) weights
// gives the same bits as matmul over the unpacked data (portable kernel) on every instruction set,
// batch size and thread count, and stays within the documented bound of the f64 reference.
#include "backend/packed_weights.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "backend/matmul.h"
#include "backend/random_rows.h"
#include "core/thread_pool.h"
#include "reference/reference_q8.h"
#include "reference/reference_quant.h"
#include "tensor/quant.h"

namespace vesper::backend {
namespace cpu {
// packed_vnni_emulated.cpp: the AVX-512 VNNI packed kernels on SIMDe's vpdpbusd.
MatmulKernel emulated_vnni_packed_kernel(tensor::GgmlType type);
}  // namespace cpu
namespace {

using cpu::Isa;
using tensor::GgmlType;
using test_rows::gaussian;
using test_rows::same_bits;

// Gives every block of a row of `row_bytes` bytes a finite, moderate fp16 scale (and min scale),
// which random or constant bytes could make inf or NaN.
void set_block_scales(GgmlType type, uint8_t* row, size_t row_bytes, std::mt19937& rng) {
  for (size_t b = 0; b < row_bytes; b += tensor::traits(type).type_size) {
    auto set_scale = [&](size_t at) {
      row[b + at] = static_cast<uint8_t>(rng());
      row[b + at + 1] = static_cast<uint8_t>(0x20 + rng() % 0x10);
    };
    switch (type) {
      case GgmlType::kQ2_K:  // d@80, dmin@82
        set_scale(80);
        set_scale(82);
        break;
      case GgmlType::kQ3_K:
        set_scale(108);
        break;
      case GgmlType::kQ4_K:  // d@0, dmin@2
      case GgmlType::kQ5_K:
        set_scale(0);
        set_scale(2);
        break;
      case GgmlType::kQ6_K:
        set_scale(208);
        break;
      default:  // q4_0, q8_0: d@0
        set_scale(0);
        break;
    }
  }
}

// Quantized from Gaussian values; every 5th row from random bytes instead (any scale, any
// quants: q8_0's -128 included), since kernels must be exact for every bit pattern.
std::vector<uint8_t> make_weights(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  const size_t row_bytes = tensor::row_size(type, n_in);
  std::vector<uint8_t> w(row_bytes * static_cast<size_t>(n_out));
  for (int64_t o = 0; o < n_out; ++o) {
    uint8_t* row = w.data() + o * row_bytes;
    if (o % 5 == 4) {
      for (size_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(rng());
      set_block_scales(type, row, row_bytes, rng);
      continue;
    }
    const std::vector<float> values = gaussian(n_in, rng);
    tensor::quantize_row(type, values.data(), row, n_in);
  }
  return w;
}

std::vector<float> run_unpacked(GgmlType type, const std::vector<uint8_t>& w, int64_t n_in,
                                int64_t n_out, const std::vector<float>& x, int64_t n_rows,
                                ThreadPool& pool) {
  std::vector<float> y(static_cast<size_t>(n_rows * n_out), std::nanf(""));
  cpu::matmul_with_isa(Isa::kScalar, type, w.data(), n_in, n_out, x.data(), n_rows, y.data(), pool);
  return y;
}

std::vector<float> run_packed(Isa isa, const PackedWeights& p, const float* x, int64_t n_rows,
                              ThreadPool& pool) {
  std::vector<float> y(static_cast<size_t>(n_rows * p.n_out()), std::nanf(""));
  cpu::matmul_packed_with_isa(isa, p, x, n_rows, y.data(), pool);
  return y;
}

// Checks y against the f64 product of the exact weights and the oracle's quantized activations,
// within backend/matmul.h's bound (n_in / B + 6) * 2^-24 * sum (|A| + |N|) |xa|.
void expect_near_reference(GgmlType type, const std::vector<uint8_t>& w, int64_t n_in,
                           int64_t n_out, const std::vector<float>& x, int64_t n_rows,
                           const std::vector<float>& y, const std::string& trace) {
  const size_t row_bytes = tensor::row_size(type, n_in);
  const int64_t block = PackedWeights::chunk_block(type);
  std::vector<std::vector<double>> xa;
  for (int64_t r = 0; r < n_rows; ++r)
    xa.push_back(
        reference::quantize_activations(matmul_activation_quant(type), x.data() + r * n_in, n_in));
  for (int64_t o = 0; o < n_out; ++o) {
    const uint8_t* row = w.data() + o * row_bytes;
    const std::vector<double> wo = reference::dequantize_row(type, row, n_in);
    const std::vector<double> no = reference::min_part(type, row, n_in);
    for (int64_t r = 0; r < n_rows; ++r) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t i = 0; i < n_in; ++i) {
        sum += wo[i] * xa[r][i];
        abs_sum += (std::fabs(wo[i] - no[i]) + std::fabs(no[i])) * std::fabs(xa[r][i]);
      }
      const double bound = (n_in / block + 6) * std::ldexp(1.0, -24) * abs_sum * (1 + 1e-6) + 1e-30;
      ASSERT_LE(std::fabs(y[r * n_out + o] - sum), bound)
          << trace << " row " << r << " feature " << o;
    }
  }
}

TEST(PackedWeights, PacksOnlyQ4_0Q8_0AndKQuantsWithWholeGroupsOfEightRows) {
  EXPECT_TRUE(packable(GgmlType::kQ4_0, 64, 8));
  EXPECT_TRUE(packable(GgmlType::kQ8_0, 32, 200));
  EXPECT_TRUE(packable(GgmlType::kQ4_K, 512, 16));
  EXPECT_FALSE(packable(GgmlType::kQ4_K, 256, 12));
  EXPECT_TRUE(packable(GgmlType::kQ5_K, 256, 8));
  EXPECT_TRUE(packable(GgmlType::kQ2_K, 256, 8));
  EXPECT_TRUE(packable(GgmlType::kQ3_K, 512, 24));
  EXPECT_FALSE(packable(GgmlType::kQ3_K, 256, 20));
  EXPECT_FALSE(packable(GgmlType::kQ8_K, 256, 8));
  EXPECT_FALSE(packable(GgmlType::kQ5_K, 256, 4));
  EXPECT_TRUE(packable(GgmlType::kQ6_K, 256, 8));
  EXPECT_FALSE(packable(GgmlType::kQ6_K, 128, 8));
  EXPECT_FALSE(packable(GgmlType::kQ4_0, 64, 12));
  EXPECT_FALSE(packable(GgmlType::kQ8_0, 64, 7));
  EXPECT_FALSE(packable(GgmlType::kQ4_0, 48, 8));
  EXPECT_FALSE(packable(GgmlType::kQ5_0, 64, 8));
  EXPECT_FALSE(packable(GgmlType::kF32, 64, 8));
  std::mt19937 rng(1);
  const std::vector<uint8_t> w = make_weights(GgmlType::kQ4_0, 64, 12, rng);
  EXPECT_TRUE(prepare_weights(GgmlType::kQ4_0, w.data(), 64, 12).empty());
  const PackedWeights p = prepare_weights(GgmlType::kQ4_0, w.data(), 64, 8);
  ASSERT_FALSE(p.empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.quants()) % 64, 0u);
  EXPECT_EQ(p.n_in(), 64);
  EXPECT_EQ(p.n_out(), 8);
  EXPECT_EQ(p.bytes(), 2u * (128 + 16));
  const std::vector<uint8_t> wk = make_weights(GgmlType::kQ4_K, 512, 16, rng);
  const PackedWeights pk = prepare_weights(GgmlType::kQ4_K, wk.data(), 512, 16);
  ASSERT_FALSE(pk.empty());
  EXPECT_EQ(pk.bytes(), 4u * (1024 + 160));  // 2 groups x 2 super-blocks
  const std::vector<uint8_t> w5 = make_weights(GgmlType::kQ5_K, 256, 8, rng);
  EXPECT_EQ(prepare_weights(GgmlType::kQ5_K, w5.data(), 256, 8).bytes(), 1280u + 160);
  const std::vector<uint8_t> w2 = make_weights(GgmlType::kQ2_K, 256, 8, rng);
  EXPECT_EQ(prepare_weights(GgmlType::kQ2_K, w2.data(), 256, 8).bytes(), 512u + 288);
  const std::vector<uint8_t> w3 = make_weights(GgmlType::kQ3_K, 256, 8, rng);
  EXPECT_EQ(prepare_weights(GgmlType::kQ3_K, w3.data(), 256, 8).bytes(), 768u + 144);
  const std::vector<uint8_t> w6 = make_weights(GgmlType::kQ6_K, 256, 8, rng);
  EXPECT_EQ(prepare_weights(GgmlType::kQ6_K, w6.data(), 256, 8).bytes(), 1536u + 144);
}

class PackedMatmul : public ::testing::TestWithParam<GgmlType> {};

// Every (n_in, n_out, n_rows) shape: packed on every ISA at 1, 2 and 3 threads equals the
// portable unpacked kernel bit for bit, which is within the f64 reference's bound.
TEST_P(PackedMatmul, EqualsUnpackedBitForBitAndNearReference) {
  const GgmlType type = GetParam();
  std::mt19937 rng(4242);
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  struct Shape {
    int64_t blocks, n_out;
    std::vector<int64_t> rows;
  };
  const std::vector<int64_t> all_rows = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 67};
  const int64_t block = PackedWeights::chunk_block(type);
  // k-quant blocks are 8 times longer: fewer of them keep the f64 reference's work alike.
  const std::vector<Shape> shapes_k = {
      {1, 8, all_rows},
      {2, 16, all_rows},
      {3, 24, all_rows},
      {5, 8, all_rows},
      {9, 200, {1, 4, 9, 67}},
      // More rows than one cache panel of the AVX2 kernel holds (128 rows of 2048).
      {8, 16, {131}},
  };
  const std::vector<Shape> shapes =
      block == 256 ? shapes_k
                   : std::vector<Shape>{
                         {1, 8, all_rows},
                         {2, 16, all_rows},
                         {3, 24, all_rows},
                         {5, 8, all_rows},
                         {17, 16, all_rows},
                         {70, 24, all_rows},
                         {70, 200, {1, 4, 9, 67}},
                         {33, 200, {2, 3, 15}},
                         // More rows than one cache panel of the AVX2 kernel holds (128 rows of
                         // 2048), with a partial last row tile.
                         {64, 16, {131}},
                     };
  for (const Shape& s : shapes) {
    const int64_t n_in = block * s.blocks;
    const std::vector<uint8_t> w = make_weights(type, n_in, s.n_out, rng);
    const PackedWeights p = prepare_weights(type, w.data(), n_in, s.n_out);
    ASSERT_FALSE(p.empty());
    for (int64_t n_rows : s.rows) {
      const std::vector<float> x = gaussian(n_in * n_rows, rng);
      const std::vector<float> want = run_unpacked(type, w, n_in, s.n_out, x, n_rows, *pools[0]);
      const std::string shape = std::string(tensor::type_name(type)) + " n_in " +
                                std::to_string(n_in) + " n_out " + std::to_string(s.n_out) +
                                " n_rows " + std::to_string(n_rows);
      expect_near_reference(type, w, n_in, s.n_out, x, n_rows, want, shape);
      for (Isa isa : cpu::available_isas()) {
        for (const auto& pool : pools) {
          const std::vector<float> y = run_packed(isa, p, x.data(), n_rows, *pool);
          for (int64_t k = 0; k < n_rows * s.n_out; ++k)
            ASSERT_TRUE(same_bits(y[k], want[k]))
                << shape << " isa " << cpu::isa_name(isa) << " threads " << pool->num_threads()
                << " row " << k / s.n_out << " feature " << k % s.n_out << ": " << y[k] << " vs "
                << want[k];
        }
      }
    }
  }
}

// Each row alone gives the bits it gets inside a batch of 67 (batch invariance), and the AVX2
// unpacked kernel, also on the block-sum / block-total contract, gives them too.
TEST_P(PackedMatmul, RowAloneEqualsRowInBatch) {
  const GgmlType type = GetParam();
  std::mt19937 rng(99);
  ThreadPool pool(3);
  const int64_t n_in = PackedWeights::chunk_block(type) * 9, n_out = 40, n_rows = 67;
  const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
  const PackedWeights p = prepare_weights(type, w.data(), n_in, n_out);
  const std::vector<float> x = gaussian(n_in * n_rows, rng);
  for (Isa isa : cpu::available_isas()) {
    const std::vector<float> batch = run_packed(isa, p, x.data(), n_rows, pool);
    std::vector<float> unpacked(static_cast<size_t>(n_rows * n_out));
    cpu::matmul_with_isa(isa, type, w.data(), n_in, n_out, x.data(), n_rows, unpacked.data(), pool);
    for (int64_t r = 0; r < n_rows; ++r) {
      const std::vector<float> alone = run_packed(isa, p, x.data() + r * n_in, 1, pool);
      for (int64_t o = 0; o < n_out; ++o) {
        ASSERT_TRUE(same_bits(alone[o], batch[r * n_out + o])) << "row " << r << " out " << o;
        ASSERT_TRUE(same_bits(unpacked[r * n_out + o], batch[r * n_out + o]))
            << "row " << r << " out " << o;
      }
    }
  }
}

// The integer sums' worst cases: every quant byte 0xFF, 0x80 or 0x7F (the largest unsigned
// quants of every type, q8_0's -128 and +127) against activations whose quants are all +127 or
// all -127 (constant rows), where int16 partial sums come closest to overflowing. Packed kernels
// on every ISA (and the emulated VNNI ones) equal the portable unpacked kernel bit for bit, and the
// AVX2 unpacked kernel does too.
TEST_P(PackedMatmul, ExtremeQuantsAndActivationsStayExact) {
  const GgmlType type = GetParam();
  std::mt19937 rng(7);
  ThreadPool pool(2);
  const int64_t n_in = PackedWeights::chunk_block(type) * 3, n_out = 16, n_rows = 5;
  std::vector<float> x(static_cast<size_t>(n_in * n_rows));
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < n_in; ++i) x[r * n_in + i] = r % 2 == 0 ? 1.5f : -0.75f;
  const cpu::MatmulKernel vnni = cpu::emulated_vnni_packed_kernel(type);
  ASSERT_NE(vnni, nullptr);
  for (uint8_t fill : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}}) {
    const size_t row_bytes = tensor::row_size(type, n_in);
    std::vector<uint8_t> w(row_bytes * n_out, fill);
    for (int64_t o = 0; o < n_out; ++o)
      set_block_scales(type, w.data() + o * row_bytes, row_bytes, rng);
    const PackedWeights p = prepare_weights(type, w.data(), n_in, n_out);
    const std::vector<float> want = run_unpacked(type, w, n_in, n_out, x, n_rows, pool);
    expect_near_reference(type, w, n_in, n_out, x, n_rows, want, "fill " + std::to_string(fill));
    std::vector<std::pair<std::string, std::vector<float>>> got;
    for (Isa isa : cpu::available_isas()) {
      got.emplace_back("packed " + std::string(cpu::isa_name(isa)),
                       run_packed(isa, p, x.data(), n_rows, pool));
      std::vector<float> y(static_cast<size_t>(n_rows * n_out));
      cpu::matmul_with_isa(isa, type, w.data(), n_in, n_out, x.data(), n_rows, y.data(), pool);
      got.emplace_back("unpacked " + std::string(cpu::isa_name(isa)), y);
    }
    if (cpu::isa_available(Isa::kAvx2)) {
      std::vector<float> y(static_cast<size_t>(n_rows * n_out), std::nanf(""));
      cpu::matmul_packed_with_kernel(Isa::kAvx2, vnni, p, x.data(), n_rows, y.data(), pool);
      got.emplace_back("emulated VNNI", y);
    }
    for (const auto& [name, y] : got)
      for (int64_t k = 0; k < n_rows * n_out; ++k)
        ASSERT_TRUE(same_bits(y[k], want[k])) << name << " fill " << int{fill} << " element " << k
                                              << ": " << y[k] << " vs " << want[k];
  }
}

// The AVX-512 VNNI kernels' logic on any AVX2 machine: built on SIMDe's portable vpdpbusd
// (packed_vnni_emulated.cpp), they equal the portable unpacked kernel bit for bit at every tile
// shape, thread count and panel split. (Where the CPU has AVX-512 VNNI, the native kernels also
// run in EqualsUnpackedBitForBitAndNearReference, through cpu::available_isas().)
TEST(PackedMatmulVnni, EmulatedKernelsEqualUnpackedBitForBit) {
  if (!cpu::isa_available(Isa::kAvx2)) GTEST_SKIP() << "the emulation is built on AVX2";
  std::mt19937 rng(515);
  ThreadPool pool1(1), pool3(3);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
                        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const cpu::MatmulKernel kernel = cpu::emulated_vnni_packed_kernel(type);
    ASSERT_NE(kernel, nullptr) << tensor::type_name(type);
    const int64_t block = PackedWeights::chunk_block(type);
    // Blocks of 256 (k-quants) take fewer of them, for alike work.
    const std::vector<std::pair<int64_t, int64_t>> shapes =
        block == 256
            ? std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 24}, {8, 16}}
            : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 24}, {17, 16}, {64, 16}};
    for (const auto& [blocks, n_out] : shapes) {
      const int64_t n_in = block * blocks;
      const std::vector<uint8_t> w = make_weights(type, n_in, n_out, rng);
      const PackedWeights p = prepare_weights(type, w.data(), n_in, n_out);
      for (int64_t n_rows : {1, 2, 3, 4, 5, 9, 131}) {
        const std::vector<float> x = gaussian(n_in * n_rows, rng);
        const std::vector<float> want = run_unpacked(type, w, n_in, n_out, x, n_rows, pool1);
        for (ThreadPool* pool : {&pool1, &pool3}) {
          std::vector<float> y(static_cast<size_t>(n_rows * n_out), std::nanf(""));
          cpu::matmul_packed_with_kernel(Isa::kAvx2, kernel, p, x.data(), n_rows, y.data(), *pool);
          for (int64_t k = 0; k < n_rows * n_out; ++k)
            ASSERT_TRUE(same_bits(y[k], want[k]))
                << tensor::type_name(type) << " n_in " << n_in << " n_out " << n_out << " n_rows "
                << n_rows << " threads " << pool->num_threads() << " element " << k << ": " << y[k]
                << " vs " << want[k];
        }
      }
    }
  }
  EXPECT_EQ(cpu::emulated_vnni_packed_kernel(GgmlType::kQ5_0), nullptr);  // not packed
}

INSTANTIATE_TEST_SUITE_P(Types, PackedMatmul,
                         ::testing::Values(GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ2_K,
                                           GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                           GgmlType::kQ6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(tensor::type_name(info.param));
                         });

}  // namespace
}  // namespace vesper::backend
