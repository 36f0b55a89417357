// Tests of backend::matmul_group (backend/matmul.h): a group of products that share their input
// gives, for every target, the bits that one matmul per target gives, whatever the mix of packed
// and in-place weights, activation formats and row tiles, on every instruction set, batch size and
// thread count; and bad groups are refused with a message that names the fault.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "backend/matmul.h"
#include "backend/packed_weights.h"
#include "backend/random_rows.h"
#include "core/thread_pool.h"
#include "tensor/quant.h"

namespace vesper::backend {
namespace {

using cpu::Isa;
using tensor::GgmlType;
using test_rows::gaussian;
using test_rows::same_bits;

// One weight matrix of a group: its data, and its packed copy where the type packs.
struct Matrix {
  GgmlType type;
  int64_t n_out;
  std::vector<uint8_t> data;
  PackedWeights packed;
};

Matrix make_matrix(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  Matrix m{type, n_out, std::vector<uint8_t>(tensor::row_size(type, n_in) * n_out), {}};
  for (int64_t o = 0; o < n_out; ++o) {
    const std::vector<float> values = gaussian(n_in, rng);
    tensor::quantize_row(type, values.data(), m.data.data() + o * tensor::row_size(type, n_in),
                         n_in);
  }
  m.packed = prepare_weights(type, m.data.data(), n_in, n_out);
  return m;
}

// The groups the model runs (q, k, v of a Q4_K_M-style file: q4_K, q4_K packed, q6_K with an odd
// row count so it stays in place; gate and up) and mixes of every activation layout: Q8_0 tiled
// and plain, Q8_K tiled and plain, f32.
TEST(MatmulGroup, EachTargetEqualsItsOwnMatmulBitForBit) {
  std::mt19937 rng(2024);
  const int64_t n_in = 512;
  struct Group {
    std::vector<std::pair<GgmlType, int64_t>> targets;  // type, n_out
  };
  const std::vector<Group> groups = {
      {{{GgmlType::kQ4_K, 64}, {GgmlType::kQ4_K, 16}, {GgmlType::kQ6_K, 20}}},
      {{{GgmlType::kQ4_0, 48}, {GgmlType::kQ4_0, 48}}},
      {{{GgmlType::kQ8_0, 24}, {GgmlType::kQ4_0, 13}, {GgmlType::kQ6_K, 8}, {GgmlType::kF16, 9}}},
      {{{GgmlType::kQ5_K, 7}}},
  };
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int t : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(t));
  for (const Group& g : groups) {
    std::vector<Matrix> matrices;
    for (const auto& [type, n_out] : g.targets)
      matrices.push_back(make_matrix(type, n_in, n_out, rng));
    // 1 and 5 rows run on the calling thread (small), 67 rows on the pool.
    for (int64_t n_rows : {1, 5, 67}) {
      const std::vector<float> x = gaussian(n_in * n_rows, rng);
      for (Isa isa : cpu::available_isas()) {
        for (const auto& pool : pools) {
          std::vector<std::vector<float>> want, got;
          std::vector<MatmulTarget> targets;
          for (const Matrix& m : matrices) {
            want.emplace_back(static_cast<size_t>(n_rows * m.n_out));
            got.emplace_back(static_cast<size_t>(n_rows * m.n_out), std::nanf(""));
            if (m.packed.empty()) {
              cpu::matmul_with_isa(isa, m.type, m.data.data(), n_in, m.n_out, x.data(), n_rows,
                                   want.back().data(), *pool);
              targets.push_back({nullptr, m.type, m.data.data(), m.n_out, got.back().data()});
            } else {
              cpu::matmul_packed_with_isa(isa, m.packed, x.data(), n_rows, want.back().data(),
                                          *pool);
              targets.push_back({&m.packed, m.type, nullptr, m.n_out, got.back().data()});
            }
          }
          cpu::matmul_group_with_isa(isa, targets.data(), static_cast<int>(targets.size()), n_in,
                                     x.data(), n_rows, *pool);
          for (size_t i = 0; i < matrices.size(); ++i)
            for (size_t k = 0; k < want[i].size(); ++k)
              ASSERT_TRUE(same_bits(got[i][k], want[i][k]))
                  << "target " << i << " (" << tensor::type_name(matrices[i].type) << ") isa "
                  << cpu::isa_name(isa) << " threads " << pool->num_threads() << " rows " << n_rows
                  << " element " << k << ": " << got[i][k] << " vs " << want[i][k];
        }
      }
    }
  }
}

TEST(MatmulGroupDeathTest, RefusesTooManyTargetsAndMismatchedInputs) {
  std::mt19937 rng(7);
  const Matrix a = make_matrix(GgmlType::kQ4_0, 64, 8, rng);
  const Matrix b = make_matrix(GgmlType::kQ4_0, 128, 8, rng);
  std::vector<float> x(128), y(8);
  ThreadPool pool(1);
  const MatmulTarget one{&a.packed, a.type, nullptr, 8, y.data()};
  const std::vector<MatmulTarget> five(5, one);
  EXPECT_DEATH(matmul_group(five.data(), 5, 64, x.data(), 1, pool), "5 targets");
  const MatmulTarget wrong{&b.packed, b.type, nullptr, 8, y.data()};
  EXPECT_DEATH(matmul_group(&wrong, 1, 64, x.data(), 1, pool), "target 0 has n_in 128, not 64");
}

}  // namespace
}  // namespace vesper::backend
