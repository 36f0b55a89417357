// Internal to tensor/: the scale searches the quantizers share. Each fits one group of values
// (a sub-block) with integer levels and a scale (and an offset for the affine formats), trying a
// handful of candidate scales and solving least squares for each candidate's levels, in the
// manner of ggml's make_qx_quants / make_qkx2_quants reference routines.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>

namespace vesper::tensor::detail {

// Round to nearest, ties to even (the current rounding mode), by the float magic-number trick,
// which stays inline where std::lrint may be a libm call. The argument is clamped first (NaN
// included) to where the trick is exact; every caller clamps the result to a few bits anyway.
inline int nearest_int(float v) {
  constexpr float kLimit = 4194303.0f;  // 2^22 - 1
  if (!(v > -kLimit)) v = -kLimit;
  if (v > kLimit) v = kLimit;
  const float shifted = v + 12582912.0f;  // 1.5 * 2^23: the integer lands in the low mantissa bits
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007FFFFF) - 0x00400000;
}

// Symmetric fit x[i] ~= scale * levels[i] with levels in [-nmax, nmax - 1], minimising
// sum weights[i] * (x[i] - scale * levels[i])^2. Returns the scale (0 when x is all zero; its sign
// follows the value of largest magnitude, which is mapped to -nmax). `refine` passes of
// coordinate descent move single levels while that lowers the error.
float fit_symmetric(std::span<const float> x, std::span<const float> weights, int nmax,
                    int8_t* levels, int refine);

// Affine fit x[i] ~= scale * levels[i] - min with levels in [0, nmax], scale >= 0 and min >= 0
// (the offset is never positive, as in ggml: a group of all-positive values keeps zero reachable).
// Tries iscale = (nmax + rmin + rdelta * k) / (max - min) for k = 0 .. nstep.
struct AffineFit {
  float scale;
  float min;
};
AffineFit fit_affine(std::span<const float> x, std::span<const float> weights, int nmax,
                     uint8_t* levels, float rmin, float rdelta, int nstep);

}  // namespace vesper::tensor::detail
