// Request arrival times of a serving benchmark, as vLLM's benchmark_serving draws them: the first
// request at time 0, then gaps drawn from a gamma distribution with shape `burstiness` and mean
// 1 / request_rate. burstiness 1 gives exponential gaps, i.e. Poisson arrivals at `request_rate`
// requests per second; below 1 arrivals are burstier, above 1 more regular. An infinite rate
// sends every request at time 0. Seeded: the same seed gives the same times.
#pragma once

#include <cstdint>
#include <vector>

namespace vesper::client {

// Send offsets in seconds from the start of the benchmark, non-decreasing, one per request.
// `request_rate` > 0 (may be infinity), `burstiness` > 0.
std::vector<double> arrival_offsets(int64_t num_requests, double request_rate, double burstiness,
                                    uint64_t seed);

}  // namespace vesper::client
