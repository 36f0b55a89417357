#include "reference/reference_q8.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdlib>

namespace vesper::reference {
namespace {

// v rounded to the nearest IEEE half (ties to even), for |v| below the half range.
double round_to_half(float v) {
  const double a = std::fabs(static_cast<double>(v));
  if (a == 0.0) return v;
  int e;
  std::frexp(a, &e);                          // a in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, -14);  // subnormal halves share 2^-14's spacing
  const double quantum = std::ldexp(1.0, exponent - 10);
  const double r = std::nearbyint(a / quantum) * quantum;  // a / quantum is exact
  if (r > 65504.0) std::abort();
  return v < 0 ? -r : r;
}

// nearbyint(scaled), or its other neighbour for the traced element to flip; records near ties.
double round_traced(float scaled, RoundingTrace* trace) {
  const double r = std::nearbyint(scaled);
  if (trace == nullptr) return r;
  const int64_t index = trace->next++;
  const double frac = static_cast<double>(scaled) - std::floor(static_cast<double>(scaled));
  if (std::fabs(frac - 0.5) < trace->window) trace->near_ties.push_back(index);
  if (index != trace->flip) return r;
  return r > scaled ? r - 1 : r + 1;
}

void q8_0_block(const float* x, double* out, RoundingTrace* trace) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d_f32 = amax / 127.0f;
  const double d = round_to_half(d_f32);
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < 32; ++i) {
    const float scaled = x[i] * id;
    out[i] = d * round_traced(scaled, trace);
  }
}

void q8_k_block(const float* x, double* out, RoundingTrace* trace) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < 256; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax == 0.0f) {
    for (int i = 0; i < 256; ++i) out[i] = 0.0;
    return;
  }
  const float iscale = -127.0f / max;
  const float d = 1.0f / iscale;
  for (int i = 0; i < 256; ++i) {
    const float scaled = iscale * x[i];
    out[i] = static_cast<double>(d) * std::min(127.0, round_traced(scaled, trace));
  }
}

}  // namespace

std::vector<double> quantize_activations(backend::ActivationQuant format, const float* x, int64_t n,
                                         RoundingTrace* trace) {
  if (std::fegetround() != FE_TONEAREST) std::abort();
  std::vector<double> out(x, x + n);
  if (format == backend::ActivationQuant::kQ8_0) {
    if (n % 32 != 0) std::abort();
    for (int64_t b = 0; b < n; b += 32) q8_0_block(x + b, out.data() + b, trace);
  } else if (format == backend::ActivationQuant::kQ8_K) {
    if (n % 256 != 0) std::abort();
    for (int64_t b = 0; b < n; b += 256) q8_k_block(x + b, out.data() + b, trace);
  }
  return out;
}

}  // namespace vesper::reference
