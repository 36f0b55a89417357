// Serving metrics over a benchmark's requests, defined as vLLM's benchmark_serving defines them
// (calculate_metrics), so that figures from `vesper bench serve` and from vLLM read the same:
//   completed / failed        requests that succeeded / failed
//   total_input, total_output prompt tokens and generated tokens of the completed requests
//   request_throughput        completed / duration
//   output_throughput         total_output / duration
//   total_token_throughput    (total_input + total_output) / duration
//   TTFT, E2EL                one sample per completed request
//   TPOT                      (E2EL - TTFT) / (output_tokens - 1), per completed request with
//                             more than one output token
//   ITL                       every inter-token gap of every completed request, pooled
// Each distribution gives mean, median, standard deviation (population, as numpy.std) and the
// asked percentiles, computed as numpy.percentile's default "linear" method; an empty
// distribution gives zeros (vLLM's `np.mean(x or 0)`). Times in milliseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "client/request_output.h"

namespace vesper::client {

// numpy.percentile(values, p) with the default linear interpolation: the value at virtual index
// p/100 * (n - 1) of the sorted values. `p` in [0, 100]; 0 for no values.
double percentile(std::span<const double> values, double p);

struct Distribution {
  double mean = 0;
  double median = 0;
  double std = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value)
};

// Distribution of `values` scaled by `scale` (1000 for seconds to milliseconds).
Distribution summarize(std::span<const double> values, std::span<const double> percentiles,
                       double scale = 1.0);

struct BenchMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double duration_s = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  Distribution ttft_ms;
  Distribution tpot_ms;
  Distribution itl_ms;
  Distribution e2el_ms;
};

// TPOT of one request in seconds; nothing when it failed or generated at most one token.
std::optional<double> request_tpot(const RequestOutput& out);

BenchMetrics calculate_metrics(std::span<const RequestOutput> outputs, double duration_s,
                               std::span<const double> percentiles);

}  // namespace vesper::client
