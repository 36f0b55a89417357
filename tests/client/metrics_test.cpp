// Metrics: numpy's linear percentiles, the TPOT definition, and vLLM's aggregate metrics.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "client/metrics.h"

namespace vesper::client {
namespace {

TEST(Percentile, MatchesNumpyLinearInterpolation) {
  // Values from numpy.percentile.
  const std::vector<double> a = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile(a, 0), 15);
  EXPECT_DOUBLE_EQ(percentile(a, 40), 29);
  EXPECT_DOUBLE_EQ(percentile(a, 50), 35);
  EXPECT_NEAR(percentile(a, 99), 49.6, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(a, 100), 50);
  const std::vector<double> b = {10, 7, 4, 3, 2, 1};  // numpy's docs: percentile(a, 50) == 3.5
  EXPECT_DOUBLE_EQ(percentile(b, 50), 3.5);
  const std::vector<double> c = {3, 1, 4, 1, 5, 9, 2, 6};  // unsorted input
  EXPECT_NEAR(percentile(c, 99), 8.79, 1e-12);
  EXPECT_NEAR(percentile(c, 90), 6.9, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(c, 12.5), 1);
}

TEST(Percentile, SingleAndEmpty) {
  const std::vector<double> one = {7};
  EXPECT_DOUBLE_EQ(percentile(one, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0);
}

TEST(Summarize, MeanMedianPopulationStdAndScale) {
  const std::vector<double> c = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<double> ps = {50, 99};
  const Distribution d = summarize(c, ps, 1000.0);
  EXPECT_NEAR(d.mean, 3875, 1e-9);
  EXPECT_NEAR(d.median, 3500, 1e-9);
  EXPECT_NEAR(d.std, std::sqrt(52.875 / 8) * 1000, 1e-9);  // numpy.std: ddof = 0
  ASSERT_EQ(d.percentiles.size(), 2u);
  EXPECT_EQ(d.percentiles[1].first, 99);
  EXPECT_NEAR(d.percentiles[1].second, 8790, 1e-9);
  const Distribution empty = summarize({}, ps, 1000.0);  // vLLM: np.mean(x or 0) == 0
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.percentiles[1].second, 0);
}

RequestOutput ok_output(double ttft, double latency, int64_t tokens, std::vector<double> itl,
                        int64_t prompt_len) {
  RequestOutput o;
  o.success = true;
  o.ttft_s = ttft;
  o.latency_s = latency;
  o.output_tokens = tokens;
  o.itl_s = std::move(itl);
  o.prompt_len = prompt_len;
  return o;
}

TEST(Tpot, ExcludesFirstTokenAndNeedsTwoTokens) {
  // 10 tokens in 1.0 s, the first after 0.1 s: the other 9 took 0.9 s, 0.1 s each.
  EXPECT_NEAR(*request_tpot(ok_output(0.1, 1.0, 10, {}, 5)), 0.1, 1e-12);
  EXPECT_FALSE(request_tpot(ok_output(0.1, 0.1, 1, {}, 5)).has_value());
  RequestOutput failed = ok_output(0.1, 1.0, 10, {}, 5);
  failed.success = false;
  EXPECT_FALSE(request_tpot(failed).has_value());
}

TEST(CalculateMetrics, AsVllmBenchmarkServing) {
  std::vector<RequestOutput> outs;
  outs.push_back(ok_output(0.1, 1.0, 10, {0.1, 0.1, 0.1}, 100));
  outs.push_back(ok_output(0.3, 0.3, 1, {}, 50));  // one token: no TPOT sample
  RequestOutput failed;
  failed.error = "HTTP 500";
  failed.prompt_len = 999;  // a failed request's tokens count nowhere
  failed.output_tokens = 999;
  outs.push_back(failed);
  const std::vector<double> ps = {99};
  const BenchMetrics m = calculate_metrics(outs, 2.0, ps);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 150);
  EXPECT_EQ(m.total_output, 11);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 5.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 80.5);
  EXPECT_NEAR(m.ttft_ms.mean, 200, 1e-9);
  EXPECT_NEAR(m.tpot_ms.mean, 100, 1e-9);  // only the 10-token request
  EXPECT_NEAR(m.itl_ms.mean, 100, 1e-9);
  EXPECT_NEAR(m.e2el_ms.mean, 650, 1e-9);
  EXPECT_NEAR(m.e2el_ms.percentiles[0].second, 300 + 700 * 0.99, 1e-9);
}

TEST(CalculateMetrics, AllFailedGivesZeros) {
  std::vector<RequestOutput> outs(3);
  const std::vector<double> ps = {99};
  const BenchMetrics m = calculate_metrics(outs, 1.0, ps);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.request_throughput, 0);
  EXPECT_EQ(m.ttft_ms.mean, 0);
}

}  // namespace
}  // namespace vesper::client
