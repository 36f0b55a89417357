// What the matmul tests share: random activation rows, and the bitwise float comparison that
// batch invariance is checked with.
#pragma once

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

namespace vesper::backend::test_rows {

// `n` values drawn from N(0, 1).
inline std::vector<float> gaussian(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

// Equal bit for bit (so -0 differs from 0 and a NaN equals itself).
inline bool same_bits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

}  // namespace vesper::backend::test_rows
