#include "tensor/quant_search.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/check.h"

namespace vesper::tensor::detail {
namespace {

// Below this magnitude a group is treated as all zero (as ggml's GROUP_MAX_EPS).
constexpr float kGroupEps = 1e-15f;
constexpr size_t kMaxGroup = 256;

}  // namespace

float fit_symmetric(std::span<const float> x, std::span<const float> weights, int nmax,
                    int8_t* levels, int refine) {
  const size_t n = x.size();
  VESPER_CHECK(n <= kMaxGroup && weights.size() == n);
  float max = 0.0f;
  float amax = 0.0f;
  for (float v : x) {
    if (std::fabs(v) > amax) {
      amax = std::fabs(v);
      max = v;
    }
  }
  if (amax < kGroupEps) {
    std::fill_n(levels, n, int8_t{0});
    return 0.0f;
  }
  // Sums in double: the comparisons below are of products of sums, where f32 loses the ranking.
  double best_sxl = 0.0, best_sll = 0.0;
  bool have_best = false;
  std::array<int8_t, kMaxGroup> trial;
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    double sxl = 0.0, sll = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      trial[i] = static_cast<int8_t>(l);
      sxl += static_cast<double>(weights[i]) * x[i] * l;
      sll += static_cast<double>(weights[i]) * l * l;
    }
    // The least-squares scale for fixed levels is sxl / sll and leaves an error of
    // sum(w x^2) - sxl^2 / sll, so the best candidate has the largest sxl^2 / sll.
    if (sll > 0 && (!have_best || sxl * sxl * best_sll > best_sxl * best_sxl * sll)) {
      std::copy_n(trial.begin(), n, levels);
      best_sxl = sxl;
      best_sll = sll;
      have_best = true;
    }
  }
  if (!have_best) {  // every weight is zero: no preference, take the plain max-based scale
    const float iscale = -static_cast<float>(nmax) / max;
    for (size_t i = 0; i < n; ++i)
      levels[i] = static_cast<int8_t>(std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1));
    return 1.0f / iscale;
  }
  for (int pass = 0; pass < refine; ++pass) {
    int changed = 0;
    for (size_t i = 0; i < n; ++i) {
      const double scale = best_sxl / best_sll;
      const int old_l = levels[i];
      const int new_l = std::clamp(nearest_int(static_cast<float>(x[i] / scale)), -nmax, nmax - 1);
      if (new_l == old_l) continue;
      const double w = weights[i];
      const double sxl = best_sxl + w * x[i] * (new_l - old_l);
      const double sll = best_sll + w * (new_l * new_l - old_l * old_l);
      if (sll > 0 && sxl * sxl * best_sll > best_sxl * best_sxl * sll) {
        levels[i] = static_cast<int8_t>(new_l);
        best_sxl = sxl;
        best_sll = sll;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  return static_cast<float>(best_sxl / best_sll);
}

AffineFit fit_affine(std::span<const float> x, std::span<const float> weights, int nmax,
                     uint8_t* levels, float rmin, float rdelta, int nstep) {
  const size_t n = x.size();
  VESPER_CHECK(n <= kMaxGroup && weights.size() == n);
  float lo = x[0], hi = x[0];
  double sw = 0.0, sx = 0.0, sx2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    const double w = weights[i];
    sw += w;
    sx += w * x[i];
    sx2 += w * x[i] * x[i];
  }
  lo = std::min(lo, 0.0f);
  if (hi == lo) {
    std::fill_n(levels, n, uint8_t{0});
    return {0.0f, -lo};
  }
  // sum w (scale * l + offset - x)^2 expanded over the sums, so that each candidate costs one
  // pass (double keeps the cancellation harmless at these sizes).
  auto weighted_error = [&](double sl, double sl2, double sxl, double scale, double offset) {
    return scale * scale * sl2 + 2 * scale * offset * sl - 2 * scale * sxl + offset * offset * sw -
           2 * offset * sx + sx2;
  };
  std::array<uint8_t, kMaxGroup> trial;
  // Levels of the grid with iscale and its sums.
  auto quantize = [&](float iscale, double* sl, double* sl2, double* sxl) {
    *sl = *sl2 = *sxl = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const double wl = static_cast<double>(weights[i]) * l;
      *sl += wl;
      *sl2 += wl * l;
      *sxl += wl * x[i];
    }
  };
  // Start from the plain min/max grid, then try stretched grids with refitted scale and offset.
  double sl, sl2, sxl;
  const float iscale0 = static_cast<float>(nmax) / (hi - lo);
  quantize(iscale0, &sl, &sl2, &sxl);
  std::copy_n(trial.begin(), n, levels);
  double best_scale = 1.0 / iscale0;
  double best_offset = lo;
  double best_err = weighted_error(sl, sl2, sxl, best_scale, best_offset);
  for (int step = 0; step <= nstep; ++step) {
    const float iscale =
        (static_cast<float>(nmax) + rmin + rdelta * static_cast<float>(step)) / (hi - lo);
    quantize(iscale, &sl, &sl2, &sxl);
    const double det = sw * sl2 - sl * sl;
    if (!(det > 0)) continue;
    double scale = (sw * sxl - sx * sl) / det;
    double offset = (sl2 * sx - sl * sxl) / det;
    if (offset > 0) {  // keep zero representable: refit the scale with the offset pinned at 0
      offset = 0;
      scale = sxl / sl2;
    }
    if (!(scale >= 0)) continue;
    const double err = weighted_error(sl, sl2, sxl, scale, offset);
    if (err < best_err) {
      std::copy_n(trial.begin(), n, levels);
      best_err = err;
      best_scale = scale;
      best_offset = offset;
    }
  }
  return {static_cast<float>(best_scale), static_cast<float>(-best_offset)};
}

}  // namespace vesper::tensor::detail
