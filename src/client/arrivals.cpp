#include "client/arrivals.h"

#include <cmath>
#include <random>

#include "core/check.h"

namespace vesper::client {

std::vector<double> arrival_offsets(int64_t num_requests, double request_rate, double burstiness,
                                    uint64_t seed) {
  VESPER_CHECK(num_requests >= 0 && request_rate > 0 && burstiness > 0,
               "n %lld, rate %g, burstiness %g", static_cast<long long>(num_requests), request_rate,
               burstiness);
  std::vector<double> offsets(static_cast<size_t>(num_requests), 0.0);
  if (std::isinf(request_rate)) return offsets;
  std::mt19937_64 rng(seed);
  // mean = shape * scale = 1 / rate
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (size_t i = 1; i < offsets.size(); ++i) offsets[i] = offsets[i - 1] + gap(rng);
  return offsets;
}

}  // namespace vesper::client
