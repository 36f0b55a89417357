#include "client/metrics.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace vesper::client {

double percentile(std::span<const double> values, double p) {
  VESPER_CHECK(p >= 0 && p <= 100, "percentile %g outside [0, 100]", p);
  if (values.empty()) return 0;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const double index = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(index));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = index - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution summarize(std::span<const double> values, std::span<const double> percentiles,
                       double scale) {
  Distribution d;
  for (double p : percentiles) d.percentiles.emplace_back(p, percentile(values, p) * scale);
  if (values.empty()) return d;
  double sum = 0;
  for (double v : values) sum += v;
  const double mean = sum / static_cast<double>(values.size());
  double sq = 0;
  for (double v : values) sq += (v - mean) * (v - mean);
  d.mean = mean * scale;
  d.std = std::sqrt(sq / static_cast<double>(values.size())) * scale;
  d.median = percentile(values, 50) * scale;
  return d;
}

std::optional<double> request_tpot(const RequestOutput& out) {
  if (!out.success || out.output_tokens <= 1) return std::nullopt;
  return (out.latency_s - out.ttft_s) / static_cast<double>(out.output_tokens - 1);
}

BenchMetrics calculate_metrics(std::span<const RequestOutput> outputs, double duration_s,
                               std::span<const double> percentiles) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestOutput& out : outputs) {
    if (!out.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += out.prompt_len;
    m.total_output += out.output_tokens;
    ttfts.push_back(out.ttft_s);
    e2els.push_back(out.latency_s);
    itls.insert(itls.end(), out.itl_s.begin(), out.itl_s.end());
    if (auto tpot = request_tpot(out)) tpots.push_back(*tpot);
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  }
  m.ttft_ms = summarize(ttfts, percentiles, 1000.0);
  m.tpot_ms = summarize(tpots, percentiles, 1000.0);
  m.itl_ms = summarize(itls, percentiles, 1000.0);
  m.e2el_ms = summarize(e2els, percentiles, 1000.0);
  return m;
}

}  // namespace vesper::client
